"""``shuniu bench``: load-test any OpenAI-compatible endpoint."""
