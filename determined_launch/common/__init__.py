"""Test-compat: ``determined.common`` names that Determined's test helpers import."""
