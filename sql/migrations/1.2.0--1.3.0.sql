-- pgdq 1.2.0 -> 1.3.0, for ALTER EXTENSION pgdq UPDATE and `pgdq upgrade`.
-- What the step changes besides the functions; python/tools/gen_upgrade.py
-- puts every function of sql/src where the @functions line is. What it
-- changes is in CHANGELOG.md; tests/test_upgrade.py checks that 1.2.0 plus
-- the step equals a fresh 1.3.0 install, object for object.

-- The step changes dq_queues (an index), dq_messages (its count triggers)
-- and dq_counts (a constraint): their locks first, in the order a poll
-- reads them (queues, then messages, then counts), so that the step waits
-- for producers and consumers, or they for it, but never both (as the step
-- from 1.1.0). SHARE ROW EXCLUSIVE is what the triggers and the index need
-- (writers wait, readers do not); the constraint's scan of dq_counts, a few
-- pages, needs ACCESS EXCLUSIVE.
LOCK TABLE @extschema@.dq_queues, @extschema@.dq_messages IN SHARE ROW EXCLUSIVE MODE;
LOCK TABLE @extschema@.dq_counts IN ACCESS EXCLUSIVE MODE;

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

-- Whether an ack may have history to record is one probe (1.3,
-- 10_storage.sql).
CREATE INDEX dq_queues_retained ON @extschema@.dq_queues (queue)
WHERE retain IS NOT NULL;

-- @functions

-- The hot statements count their own rows (12_counts.sql): the count
-- triggers skip a statement marked so (dq__counting_inline), atomically
-- with the statements that begin to mark themselves (replaced in place:
-- SHARE ROW EXCLUSIVE, where DROP TRIGGER takes ACCESS EXCLUSIVE).
CREATE OR REPLACE TRIGGER dq_count_inserted AFTER INSERT ON @extschema@.dq_messages
REFERENCING NEW TABLE AS changed_rows
FOR EACH STATEMENT
WHEN (
    pg_catalog.rtrim(pg_catalog.split_part(pg_catalog.current_setting('dq.counted', TRUE), ',', -1), 'i')
    IS DISTINCT FROM pg_catalog.pg_trigger_depth()::pg_catalog.text
)
EXECUTE FUNCTION @extschema@.dq__count_rows();
CREATE OR REPLACE TRIGGER dq_count_deleted AFTER DELETE ON @extschema@.dq_messages
REFERENCING OLD TABLE AS changed_rows
FOR EACH STATEMENT
WHEN (
    pg_catalog.split_part(pg_catalog.current_setting('dq.counted', TRUE), ',', -1)
    IS DISTINCT FROM pg_catalog.pg_trigger_depth()::pg_catalog.text
)
EXECUTE FUNCTION @extschema@.dq__count_rows();
CREATE OR REPLACE TRIGGER dq_count_updated AFTER UPDATE ON @extschema@.dq_messages
REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
FOR EACH STATEMENT
WHEN (
    pg_catalog.split_part(pg_catalog.current_setting('dq.counted', TRUE), ',', -1)
    IS DISTINCT FROM pg_catalog.pg_trigger_depth()::pg_catalog.text
)
EXECUTE FUNCTION @extschema@.dq__count_updated();

-- A count row stays within 2^32 either way (12_counts.sql): false rows
-- added by a role that may add counts cannot overflow a fold. Folded sums
-- of real messages are far below it.
ALTER TABLE @extschema@.dq_counts
ADD CONSTRAINT dq_counts_n CHECK (n BETWEEN -4294967296 AND 4294967296);
COMMENT ON TABLE @extschema@.dq_counts IS
'pgdq message counts by queue and due time (deltas, summed on read). Kept by writes to dq_messages; internal.';

-- Whoever writes messages adds their counts (12_counts.sql): every role
-- granted a write on dq_messages gets INSERT on dq_counts, as
-- docs/install.md's grants now give it (a role under row-level security
-- adds none: the triggers count its writes).
DO $$
DECLARE
    v_grantee oid;
BEGIN
    FOR v_grantee IN
        SELECT DISTINCT a.grantee
        FROM pg_catalog.pg_class AS c
        CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
        WHERE c.oid OPERATOR(pg_catalog.=) '@extschema@.dq_messages'::pg_catalog.regclass
            AND a.privilege_type OPERATOR(pg_catalog.=) ANY (ARRAY['INSERT', 'UPDATE', 'DELETE'])
            AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
    LOOP
        IF v_grantee OPERATOR(pg_catalog.=) 0 THEN
            GRANT INSERT ON @extschema@.dq_counts TO PUBLIC;
        ELSE
            EXECUTE pg_catalog.format(
                'GRANT INSERT ON @extschema@.dq_counts TO %I',
                (SELECT r.rolname FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) v_grantee)
            );
        END IF;
    END LOOP;
END
$$;

-- Warn when every role may create objects in pgdq's schema (docs/security.md).
SELECT @extschema@.dq__warn_if_open_schema(pg_catalog.current_schema());
