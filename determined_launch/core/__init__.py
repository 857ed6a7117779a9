"""Worker-side library: coordination, preemption and the local Core API."""
