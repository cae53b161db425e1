-- pgdq 1.2.0 -> 1.3.0, for ALTER EXTENSION pgdq UPDATE and `pgdq upgrade`.
-- What the step changes besides the functions; python/tools/gen_upgrade.py
-- puts every function of sql/src where the @functions line is. What it
-- changes is in CHANGELOG.md; tests/test_upgrade.py checks that 1.2.0 plus
-- the step equals a fresh 1.3.0 install, object for object.

-- History belongs to its queue: expiry takes the queues of the statement
-- that recorded (57_history.sql); the old form expired every queue.
DROP FUNCTION @extschema@.dq__expire_history(integer);

-- dq_history_stats computes its percentiles in one pass over its buckets,
-- no longer calling this per bucket (10 s for 10,000 buckets).
DROP FUNCTION @extschema@.dq__histogram_percentile(smallint[], bigint[], double precision);

-- @functions

-- Warn when every role may create objects in pgdq's schema (docs/security.md).
SELECT @extschema@.dq__warn_if_open_schema(pg_catalog.current_schema());
