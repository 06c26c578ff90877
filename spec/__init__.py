"""kvspec.spec: the normative text (the *.md chapters beside this file) and the pure
Python definitions its clauses cite.

Nothing here imports torch or any other part of kvspec: reviewers read it, CrossHair
checks its contracts, and the reference and the conformance suite both build on it.
"""
