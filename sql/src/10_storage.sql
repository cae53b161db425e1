-- Storage: one row per (queue, key), the clock, the version.

-- One row per live message. A message is in exactly one of three conditions:
--   delayed   lock_token IS NULL      and due_at >  now
--   ready     due_at <= now           (an expired lease counts as ready)
--   leased    lock_token IS NOT NULL  and due_at >  now
-- due_at is the single "next time this row matters" column: the offered
-- scheduled_at, a nack's retry_at, or while leased the lease end. That lets
-- one index, (queue, due_at, id), serve every poll and dq_next_due.
CREATE TABLE dq_messages (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- C collation: names are identifiers compared byte for byte, and cron
    -- prefix scans become plain index ranges.
    queue text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    payload jsonb NOT NULL,
    state jsonb,
    scheduled_at timestamptz NOT NULL,
    due_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    -- The current delivery's token; NULL when not leased. Its first 8 bytes
    -- are the row id (see dq__token), so acks find the row by primary key
    -- and the table needs no index on tokens.
    lock_token uuid,
    CONSTRAINT dq_messages_queue_key UNIQUE (queue, key)
) WITH (
    -- Every lease, nack and extend moves due_at, an indexed column, so those
    -- updates are never HOT and each one leaves a dead tuple behind. Free
    -- space on each page keeps the new version next to the old one, and
    -- vacuuming after 1% churn (instead of the default 20%) with no cost
    -- delay keeps dead entries from piling up at the head of the poll index
    -- however large the table grows.
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- The poll path: due messages of one queue, earliest first, ties by id.
-- Polls and dq_next_due read only the head of one queue's range, so their
-- cost does not grow with the number of delayed messages or other queues.
CREATE INDEX dq_messages_due ON dq_messages (queue, due_at, id);

COMMENT ON TABLE dq_messages IS
'pgdq messages. Use the dq_* functions; the layout is internal and may change.';

-- What a poll hands to a consumer (api-v1).
CREATE TYPE dq_delivery AS (
    id bigint,
    queue text,
    key text,
    payload jsonb,
    state jsonb,
    scheduled_at timestamptz,
    created_at timestamptz,
    attempts integer,
    redelivery boolean,
    lock_token uuid,
    lease_until timestamptz
);

-- The one clock: dq.now when set and non-empty (tests), else the wall clock.
-- Schema-qualified rather than pinned, so that it inlines into its callers.
CREATE FUNCTION dq_now() RETURNS timestamptz
LANGUAGE sql VOLATILE
AS $$
    SELECT coalesce(
        nullif(pg_catalog.current_setting('dq.now', true), '')::pg_catalog.timestamptz,
        pg_catalog.clock_timestamp()
    )
$$;

-- The installed package version.
CREATE FUNCTION dq_version() RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT '1.0.0'::text $$;
