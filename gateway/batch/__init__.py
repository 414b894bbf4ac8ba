"""OpenAI's Files and Batch APIs: uploads, batches of requests run line by line through the one request path in
the `batch` priority class, and the dispatcher that feeds them in while realtime traffic leaves room."""

from gateway.batch.apis import BatchApis

__all__ = ["BatchApis"]
