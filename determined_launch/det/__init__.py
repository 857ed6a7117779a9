"""``det``: Determined's command line over the experiments root, without a master.

The nouns, verbs, abbreviations and flags of Determined 0.38.1's ``det``
(``det e create X.yaml . -f``, ``det e list``, ``det t logs 5 -f``...) over
what ``det-launch experiment`` writes (experiment/root.py owns the root and
its ids). The top layer, beside ``det-launch``: it may import everything;
nothing imports it. See docs/cli.md.
"""
