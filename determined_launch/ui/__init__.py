"""``det-launch ui``: Determined's WebUI over run and experiment directories.

A reader beside the flow (DESIGN.md): it imports core's and experiment's file
formats, and nothing below it imports it. ``catalog`` finds experiments and
runs, ``files`` reads them (confined, parsed once), ``runs``/``study``/``api``
answer the JSON API, ``server`` serves it and the pages in ``static/``.
"""
