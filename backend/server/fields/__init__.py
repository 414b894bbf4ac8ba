"""A request body's fields: typed readers, sampling, structured-output constraints, and the gateway-only fields."""
