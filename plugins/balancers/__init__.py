"""Built-in load balancers."""
