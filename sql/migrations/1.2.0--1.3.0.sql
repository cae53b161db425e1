-- pgdq 1.2.0 -> 1.3.0, for ALTER EXTENSION pgdq UPDATE and `pgdq upgrade`.
-- What the step changes besides the functions; python/tools/gen_upgrade.py
-- puts every function of sql/src where the @functions line is. What it
-- changes is in CHANGELOG.md; tests/test_upgrade.py checks that 1.2.0 plus
-- the step equals a fresh 1.3.0 install, object for object.

-- History belongs to its queue: expiry takes the queues of the statement
-- that recorded (57_history.sql); the old form expired every queue.
DROP FUNCTION @extschema@.dq__expire_history(integer);

-- The one place that cancels takes the outcome it records (dq_finish_id,
-- 50_manage.sql); the old form had its caller set it.
DROP FUNCTION @extschema@.dq__cancel(text, bigint);

-- dq_stats() probes the queues' heads in its own statement and reads the
-- paused queues once (50_manage.sql, dq__paused_queues): a call per queue
-- cost most of its time.
DROP FUNCTION @extschema@.dq__queue_head(text, timestamptz, timestamptz);

-- What dq_deliveries and dq_delivery_of return (58_dashboard.sql, as
-- there): their columns in one place.
CREATE TYPE @extschema@.dq_delivery_info AS (
    id bigint,
    key text,
    channel text,
    priority integer,
    attempts integer,
    leased_at timestamptz,
    due_at timestamptz,
    last_error text
);

-- dq_history_stats computes its percentiles in one pass over its buckets,
-- no longer calling this per bucket (10 s for 10,000 buckets).
DROP FUNCTION @extschema@.dq__histogram_percentile(smallint[], bigint[], double precision);

-- @functions

-- Warn when every role may create objects in pgdq's schema (docs/security.md).
SELECT @extschema@.dq__warn_if_open_schema(pg_catalog.current_schema());
