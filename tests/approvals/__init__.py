"""Approval gates: the policy, the store, the held call, the API and the console."""
