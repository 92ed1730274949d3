"""security tier: one test per attack that must fail (see conftest.py for the set-up)."""
