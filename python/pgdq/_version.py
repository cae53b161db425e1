"""The pgdq version: this package's, and the SQL it installs (dq_version())."""

VERSION = "1.3.0"
