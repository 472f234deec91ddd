"""The process and what it runs on."""
