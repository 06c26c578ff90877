"""What `kvspec check`, `kvspec vectors` and `kvspec diff-helpers` run against an implementation."""
