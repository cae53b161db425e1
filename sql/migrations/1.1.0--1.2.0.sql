-- pgdq 1.1.0 -> 1.2.0, for ALTER EXTENSION pgdq UPDATE and `pgdq upgrade`.
-- What the step changes besides the functions; python/tools/gen_upgrade.py
-- puts every function of sql/src where the @functions line is. What it
-- changes is in CHANGELOG.md; tests/test_upgrade.py checks that 1.1.0 plus
-- the step equals a fresh 1.2.0 install, object for object.

-- The step alters dq_schedules, dq_queues, dq_messages and dq_dead_letters
-- under ACCESS EXCLUSIVE locks, held until it commits. They are taken
-- first, and in the order a poll reads the tables (schedules, queues, then
-- messages, then dead letters): a step that built an index under SHARE and only then asked for
-- ACCESS EXCLUSIVE deadlocked with polls that held their row locks and
-- waited to update them (tests/test_upgrade.py). So producers and consumers
-- wait for the step instead; docs/upgrading.md gives the time.
LOCK TABLE @extschema@.dq_schedules, @extschema@.dq_queues, @extschema@.dq_messages,
    @extschema@.dq_dead_letters
IN ACCESS EXCLUSIVE MODE;

-- Functions whose arguments changed (CREATE OR REPLACE cannot change them).
-- Tokens in their queue (1.2): the lock-token functions take a last
-- argument `queue text DEFAULT NULL`; a token of another queue is stale.
DROP FUNCTION dq_ack(uuid);
DROP FUNCTION dq_ack_many(uuid[]);
DROP FUNCTION dq_nack(uuid, timestamptz, jsonb, text);
DROP FUNCTION dq_extend(uuid, interval);
DROP FUNCTION dq_dead_letter(uuid, text);

-- Times are readable (1.2): the checkers dq__check_time and
-- dq__check_time_elements (years 1 to 9999 UTC, not only finite times)
-- replace dq__check_finite and dq__check_finite_elements.
DROP FUNCTION dq__check_finite(timestamptz, text);
DROP FUNCTION dq__check_finite_elements(timestamptz[], text);

-- dq__leases_held returns a table of one row (1.2), which its callers'
-- statements inline: as a scalar it was planned anew in every one.
DROP FUNCTION dq__leases_held(text, text, timestamptz, integer);

-- Raising functions are VOLATILE (1.2, issue 27): the argument checkers
-- (dq__null_check, dq__check_*), the cron parser (dq__cron_field,
-- dq__cron_parse, dq__due_occurrences) and dq__pinned_now were IMMUTABLE or
-- STABLE, which PostgreSQL 18 may run ahead of time and so raise for a
-- guarded NULL (dq_stats() failed). CREATE OR REPLACE sets a function's
-- volatility too, so the functions below make them VOLATILE: no ALTER
-- FUNCTION is needed (tests/test_upgrade.py compares the definitions).

-- Keyless messages (1.2): dq_send writes messages with key NULL, which the
-- key index leaves out (a partial unique index in place of the constraint),
-- and messages and dead letters gain headers. Building the new index reads
-- the table once; the ALTER TABLEs change only the catalog (no rewrite, no
-- scan). docs/upgrading.md gives the times.
-- On a large table the index can be built beforehand without blocking
-- anyone (docs/upgrading.md): `CREATE UNIQUE INDEX CONCURRENTLY
-- dq_messages_queue_key_1_2 ON dq_messages (queue, key) WHERE key IS NOT
-- NULL`. The step takes such an index when it is valid and is that index,
-- and builds it otherwise (1.37 s under the lock at 1,000,000 messages).
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_index AS i
        WHERE i.indexrelid = pg_catalog.to_regclass('@extschema@.dq_messages_queue_key_1_2')
            AND i.indisvalid AND i.indisready AND i.indislive
            -- exactly that index: columns, order, operator classes,
            -- collations, predicate and storage options, as PostgreSQL
            -- prints its definition
            AND pg_catalog.pg_get_indexdef(i.indexrelid) = pg_catalog.format(
                'CREATE UNIQUE INDEX dq_messages_queue_key_1_2 ON %s.dq_messages USING btree (queue, key) WHERE (key IS NOT NULL)',
                '@extschema@'::pg_catalog.regnamespace
            )
    ) THEN
        DROP INDEX IF EXISTS @extschema@.dq_messages_queue_key_1_2;
        CREATE UNIQUE INDEX dq_messages_queue_key_1_2 ON @extschema@.dq_messages (queue, key)
        WHERE key IS NOT NULL;
    END IF;
END
$$;
ALTER TABLE @extschema@.dq_messages
    DROP CONSTRAINT dq_messages_queue_key,
    ALTER COLUMN key DROP NOT NULL,
    ADD COLUMN headers jsonb,
    -- History (1.2): when the last delivery began, and at which due time
    ADD COLUMN leased_at timestamptz,
    ADD COLUMN leased_due_at timestamptz;
ALTER INDEX @extschema@.dq_messages_queue_key_1_2 RENAME TO dq_messages_queue_key;
CREATE UNIQUE INDEX dq_dead_letters_queue_key ON @extschema@.dq_dead_letters (queue, key)
WHERE key IS NOT NULL;
ALTER TABLE @extschema@.dq_dead_letters
    DROP CONSTRAINT dq_dead_letters_pkey,
    ALTER COLUMN key DROP NOT NULL,
    ADD COLUMN headers jsonb,
    REPLICA IDENTITY FULL;  -- published, it needs one (10_storage.sql)

-- Result columns added (1.2): dq_peek and dq_dead_list end with the
-- message's id, the handle of a keyless message; dq_peek, dq_get and
-- deliveries with the message's headers; dq_stats with whether the queue is
-- paused.
DROP FUNCTION dq_peek(text, text, integer);
DROP FUNCTION dq_dead_list(text, integer);
DROP FUNCTION dq_get(text, text);
DROP FUNCTION dq_stats(text);
ALTER TYPE @extschema@.dq_delivery ADD ATTRIBUTE headers jsonb;

-- Headers (1.2): offers take a last argument headers, and so do the
-- functions behind dq_offer_many.
DROP FUNCTION dq_offer(text, text, jsonb, timestamptz, boolean, text, integer);
DROP FUNCTION dq_offer_many(text, text[], jsonb[], timestamptz[], boolean, text[], integer[]);
DROP FUNCTION dq__offer_chain(
    text[], jsonb[], timestamptz[], text[], integer[], boolean, timestamptz,
    text[], jsonb[], timestamptz[], text[], integer[]
);
DROP FUNCTION dq__check_offer_arrays(text[], jsonb[], timestamptz[], text[], integer[]);
DROP FUNCTION dq__offer_new(text, text[], jsonb[], timestamptz[], text[], integer[], timestamptz);

-- Pause and resume, history (1.2): per-queue settings.
ALTER TABLE @extschema@.dq_queues
    ADD COLUMN paused_at timestamptz,
    ADD COLUMN retain interval CONSTRAINT dq_queues_retain CHECK (retain > '0' AND retain <= '3650 days'),
    ADD COLUMN history_keep interval,
    ADD COLUMN history_from timestamptz;

-- History (1.2, sql/src/57_history.sql): the records and their tallies,
-- empty until a queue turns retention on.
CREATE TABLE @extschema@.dq_history (
    queue text COLLATE "C" NOT NULL,
    key text COLLATE "C",
    id bigint NOT NULL,
    outcome text NOT NULL CONSTRAINT dq_history_outcome
        CHECK (outcome IN ('acked', 'dead', 'cancelled', 'purged')),
    payload jsonb NOT NULL,
    state jsonb,
    channel text COLLATE "C" NOT NULL,
    priority integer NOT NULL,
    created_at timestamptz NOT NULL,
    scheduled_at timestamptz NOT NULL,
    last_leased_at timestamptz,
    finished_at timestamptz NOT NULL,
    attempts integer NOT NULL,
    last_error text,
    headers jsonb,
    lateness interval
) WITH (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);
CREATE INDEX dq_history_finished ON @extschema@.dq_history (queue, finished_at);
CREATE INDEX dq_history_key ON @extschema@.dq_history (queue, key, finished_at, id)
WHERE key IS NOT NULL;
COMMENT ON TABLE @extschema@.dq_history IS
'pgdq message history (dq_retain). Written by triggers on dq_messages; use dq_history.';
CREATE TABLE @extschema@.dq_history_deltas (
    queue text COLLATE "C" NOT NULL,
    at timestamptz NOT NULL,
    measure "char" NOT NULL,
    bin smallint NOT NULL,
    n bigint NOT NULL
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);
COMMENT ON TABLE @extschema@.dq_history_deltas IS
'pgdq history tallies not yet folded. Written by triggers on dq_messages; internal.';
CREATE TABLE @extschema@.dq_history_tallies (
    queue text COLLATE "C" NOT NULL,
    width smallint NOT NULL,
    at timestamptz NOT NULL,
    measure "char" NOT NULL,
    bin smallint NOT NULL,
    n bigint NOT NULL
) WITH (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);
CREATE INDEX dq_history_tallies_at ON @extschema@.dq_history_tallies (queue, width, at);
COMMENT ON TABLE @extschema@.dq_history_tallies IS
'pgdq history tallies by second and minute. Written by triggers on dq_messages; use dq_history_stats.';
ALTER TABLE @extschema@.dq_history ENABLE ROW LEVEL SECURITY;
CREATE POLICY dq_history_unless_isolated ON @extschema@.dq_history
USING ((SELECT NOT pg_catalog.row_security_active('@extschema@.dq_messages'::regclass)));
ALTER TABLE @extschema@.dq_history_deltas ENABLE ROW LEVEL SECURITY;
CREATE POLICY dq_history_deltas_unless_isolated ON @extschema@.dq_history_deltas
USING ((SELECT NOT pg_catalog.row_security_active('@extschema@.dq_messages'::regclass)));
ALTER TABLE @extschema@.dq_history_tallies ENABLE ROW LEVEL SECURITY;
CREATE POLICY dq_history_tallies_unless_isolated ON @extschema@.dq_history_tallies
USING ((SELECT NOT pg_catalog.row_security_active('@extschema@.dq_messages'::regclass)));

-- Counts behind the overview (1.2, sql/src/12_counts.sql): the table now,
-- so that the functions reading it can be created; filled and kept by
-- triggers at the end of the step, after the rows are final.
CREATE TABLE @extschema@.dq_counts (
    queue text COLLATE "C" NOT NULL,
    due_bin timestamptz NOT NULL,
    leased boolean NOT NULL,
    n bigint NOT NULL
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_cost_delay = 0
);
COMMENT ON TABLE @extschema@.dq_counts IS
'pgdq message counts by queue and due time (deltas, summed on read). Kept by triggers on dq_messages; internal.';
ALTER TABLE @extschema@.dq_counts ENABLE ROW LEVEL SECURITY;
CREATE POLICY dq_counts_unless_isolated ON @extschema@.dq_counts
USING ((SELECT NOT pg_catalog.row_security_active('@extschema@.dq_messages'::regclass)));

-- @functions

-- Times are readable (1.2): every time pgdq accepts, stores or returns lies
-- in years 1 to 9999 UTC. Rows that 1.1.0 (or 1.0.0) let in with times
-- outside (infinity, -infinity, year 10000 and later, BC) are brought into
-- the range, so that every read of them works in any client:
-- - Messages, dead letters and channels keep everything but have their times
--   clamped to the range: a time after it becomes 9999-12-31 23:59:59.999999
--   UTC, one before it 0001-01-01 UTC. Nothing is lost and nothing behaves
--   differently: a message at infinity stays out of reach for 7,975 years,
--   one at -infinity is due now, still first in its queue, and times keep
--   their order. Deleting them would lose messages; leaving them would
--   leave reads that fail.
-- - A schedule at infinity (or past 9999) has ended: it had no next
--   occurrence a poll could ever reach, so its next_at becomes NULL, which
--   is what 1.2 writes for such a schedule (the column takes NULL from now
--   on); dq_schedule_set starts it again.
-- One pass over each table, writing only rows outside the range (the usual
-- database has none), under the locks ordinary updates take; producers and
-- consumers wait for the step (its first statement locks the tables).
UPDATE @extschema@.dq_messages
SET scheduled_at = @extschema@.dq__clamp_time(scheduled_at),
    due_at = @extschema@.dq__clamp_time(due_at),
    created_at = @extschema@.dq__clamp_time(created_at)
WHERE NOT @extschema@.dq__valid_time(scheduled_at)
    OR NOT @extschema@.dq__valid_time(due_at)
    OR NOT @extschema@.dq__valid_time(created_at);
UPDATE @extschema@.dq_dead_letters
SET scheduled_at = @extschema@.dq__clamp_time(scheduled_at),
    created_at = @extschema@.dq__clamp_time(created_at),
    failed_at = @extschema@.dq__clamp_time(failed_at)
WHERE NOT @extschema@.dq__valid_time(scheduled_at)
    OR NOT @extschema@.dq__valid_time(created_at)
    OR NOT @extschema@.dq__valid_time(failed_at);
UPDATE @extschema@.dq_groups
SET first_due = @extschema@.dq__clamp_time(first_due),
    wake_at = @extschema@.dq__clamp_time(wake_at),
    last_leased_at = @extschema@.dq__clamp_time(last_leased_at)
WHERE NOT @extschema@.dq__valid_time(first_due)
    OR NOT @extschema@.dq__valid_time(wake_at)
    OR NOT @extschema@.dq__valid_time(last_leased_at);
ALTER TABLE @extschema@.dq_schedules ALTER COLUMN next_at DROP NOT NULL;
UPDATE @extschema@.dq_schedules
SET next_at = CASE WHEN @extschema@.dq__valid_time(next_at) THEN next_at END,
    missed_from = CASE WHEN @extschema@.dq__valid_time(missed_from) THEN missed_from END,
    last_error_at = @extschema@.dq__clamp_time(last_error_at)
WHERE NOT @extschema@.dq__valid_time(next_at)
    OR NOT @extschema@.dq__valid_time(missed_from)
    OR NOT @extschema@.dq__valid_time(last_error_at);

-- Every role that may read the messages may read their counts (SELECT on
-- dq_counts, what dq_stats() of every queue reads since 1.2; PUBLIC
-- included): it learns nothing it could not count itself, and a role under
-- row-level security on dq_messages sees no count (the policy above). And
-- their history (dq_history and its tallies, 1.2), which holds what the
-- messages held when they left, under the same policy.
-- Names come from the catalog, quoted.
DO $carry_over$
DECLARE
    v_grantee text;
BEGIN
    FOR v_grantee IN
        SELECT
            CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' ELSE a.grantee::pg_catalog.regrole::text END
        FROM pg_catalog.pg_class AS c
        CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
        WHERE c.oid OPERATOR(pg_catalog.=) '@extschema@.dq_messages'::pg_catalog.regclass
            AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
            AND a.privilege_type OPERATOR(pg_catalog.=) 'SELECT'
    LOOP
        EXECUTE pg_catalog.format(
            'GRANT SELECT ON @extschema@.dq_counts, @extschema@.dq_history, @extschema@.dq_history_deltas, '
            '@extschema@.dq_history_tallies TO %s',
            v_grantee
        );
    END LOOP;
END
$carry_over$;

-- History (1.2) is users' data: pg_dump keeps it in an extension install,
-- as it keeps the messages.
DO $extension_only$
BEGIN
    IF EXISTS (
        SELECT FROM pg_catalog.pg_extension AS e
        INNER JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
        WHERE e.extname OPERATOR(pg_catalog.=) 'pgdq'
            AND n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()
    ) THEN
        PERFORM pg_catalog.pg_extension_config_dump(
            pg_catalog.format('%I.dq_history', pg_catalog.current_schema())::pg_catalog.regclass, ''
        );
        PERFORM pg_catalog.pg_extension_config_dump(
            pg_catalog.format('%I.dq_history_deltas', pg_catalog.current_schema())::pg_catalog.regclass, ''
        );
        PERFORM pg_catalog.pg_extension_config_dump(
            pg_catalog.format('%I.dq_history_tallies', pg_catalog.current_schema())::pg_catalog.regclass, ''
        );
    END IF;
END
$extension_only$;

-- Counts behind the overview (1.2): the messages as they are now, one
-- row per (queue, due bin, leased), then the triggers that keep them. One
-- pass over the table under the step's lock (docs/upgrading.md).
INSERT INTO @extschema@.dq_counts (queue, due_bin, leased, n)
SELECT m.queue, @extschema@.dq__due_bin(m.due_at), m.lock_token IS NOT NULL, count(*)
FROM @extschema@.dq_messages AS m
GROUP BY 1, 2, 3;
CREATE TRIGGER dq_count_inserted AFTER INSERT ON @extschema@.dq_messages
REFERENCING NEW TABLE AS changed_rows
FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.dq__count_rows();
CREATE TRIGGER dq_count_deleted AFTER DELETE ON @extschema@.dq_messages
REFERENCING OLD TABLE AS changed_rows
FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.dq__count_rows();
CREATE TRIGGER dq_count_updated AFTER UPDATE ON @extschema@.dq_messages
REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.dq__count_updated();
CREATE TRIGGER dq_count_truncated AFTER TRUNCATE ON @extschema@.dq_messages
FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.dq__count_truncated();

-- Warn when every role may create objects in pgdq's schema (docs/security.md).
SELECT @extschema@.dq__warn_if_open_schema(pg_catalog.current_schema());
