"""tidegate: the command line and the local stack that ties the tiers together."""
