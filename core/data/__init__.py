"""Data files shipped with shuniu (the built-in quickstart deployment)."""
