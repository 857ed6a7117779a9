"""The node launcher: the option table, runtime, membership (generations, claims with their
two storages: a shared directory or object storage), the run lease."""
