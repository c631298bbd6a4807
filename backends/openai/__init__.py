"""The ``openai`` backend: any server that speaks the OpenAI HTTP API."""
