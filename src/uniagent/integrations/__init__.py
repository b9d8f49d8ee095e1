"""Adapters that plug uniagent's interaction stack into external trainers (verl)."""
