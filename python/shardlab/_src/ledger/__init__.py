"""The ledger layer: events and the Ledger that collects them."""
