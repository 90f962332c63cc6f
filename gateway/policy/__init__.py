"""The policy's vocabulary that every stage reads: pool kinds and the routing priors."""
