"""A directory that our launchers put first on their workers' ``PYTHONPATH``
when the real ``determined`` package is not importable (``compat.py``).

It holds a ``determined`` package whose only working modules are the
launcher entry points Determined's commands name
(``python3 -m determined.launch.wrap_rank|torch_distributed|horovod|deepspeed``),
each running ours, so entrypoints and custom launchers written for Determined
run unchanged. Any other ``import determined`` fails with a one-line hint.
"""
