"""`kvspec zoo`: the seeded bugs of every registered family, each of which must be caught."""
