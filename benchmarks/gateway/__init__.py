"""What the gateway and the stack around it cost: proxying, admission, tracing, MCP, routing, batch, autoscaling."""
