-- Runs once when the container initialises its data directory.
CREATE EXTENSION IF NOT EXISTS pgdq;
CREATE EXTENSION IF NOT EXISTS pgtap;
