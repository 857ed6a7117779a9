"""``determined.launch``: the launcher entry points, mapped to determined_launch's."""
