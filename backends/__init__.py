"""moe-core's own backends, one module each; importing a module registers it."""
