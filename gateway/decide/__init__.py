"""The decision: request features, the policy, the routing rules and traffic classes."""
