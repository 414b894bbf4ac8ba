"""The backend's HTTP tier: the OpenAI API over the engine, SSE streaming, request log, metrics, tracing."""
