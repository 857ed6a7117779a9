"""What users see: the trial, its context, the Trainer, callbacks, the seed-002
spellings and the legacy entrypoint's config mapping."""
