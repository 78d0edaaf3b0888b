"""The pod and node API gpufrac's products share: annotation names, the inventory schema,
and the bounded parsing of Pod and Node objects (the extender and the node agent import
nothing of each other but this)."""
