"""Models that exist offline: built from the project's own files, never downloaded."""
