-- pgdq 1.3.0 as it was before the hot statements counted their own rows (commit daa5f99, every
-- count written by the triggers), as a plain install into public: bench/systems.py's "pgdq SQL by
-- triggers" rows install it.
BEGIN;
-- pgdq plain install into schema "public"; run in one transaction.
CREATE SCHEMA IF NOT EXISTS "public";
SET LOCAL search_path = "public";
-- pgdq: a delayed-message queue inside PostgreSQL.
-- The files of sql/src are concatenated in name order into one install script.
-- "public" stands for the schema pgdq lives in: CREATE EXTENSION fills it in,
-- and so do `make sql` and `pgdq install` for a plain install.

-- Refuse a second install into the same schema before anything is created, so
-- that a repeated install is one clear error and never a half-installed state.
DO $guard$
BEGIN
    -- The installer puts the target schema first on search_path.
    IF EXISTS (
        SELECT 1
        FROM pg_catalog.pg_class AS c
        INNER JOIN pg_catalog.pg_namespace AS n ON c.relnamespace OPERATOR(pg_catalog.=) n.oid
        WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()
            AND c.relname OPERATOR(pg_catalog.=) 'dq_messages'
    ) THEN
        RAISE EXCEPTION USING
            ERRCODE = '42710',
            MESSAGE = pg_catalog.format('pgdq is already installed in schema %I', pg_catalog.current_schema()),
            HINT = 'Drop it first (pgdq uninstall, or DROP EXTENSION pgdq) or install into another schema.';
    END IF;
END
$guard$;

-- Storage: one row per (queue, key) or keyless message, the clock, the version.

-- One row per live message. A message is in exactly one of three conditions:
--   delayed   lock_token IS NULL      and due_at >  now
--   ready     due_at <= now           (an expired lease counts as ready)
--   leased    lock_token IS NOT NULL  and due_at >  now
-- due_at is the single "next time this row matters" column: the offered
-- scheduled_at, a nack's retry_at, or while leased the lease end. That lets
-- one index, (queue, due_at, id), serve every poll and dq_next_due of a
-- plain queue; channels and priorities (since 1.1) have an index of their
-- own, so that a queue using neither pays nothing for them.
CREATE TABLE dq_messages (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- C collation: names are identifiers compared byte for byte, and cron
    -- prefix scans become plain index ranges.
    queue text COLLATE "C" NOT NULL,
    -- NULL for a keyless message (dq_send, since 1.2): never deduplicated,
    -- and kept out of the key index, so sending one writes one index entry
    -- fewer than offering one, and so does each of its leases.
    key text COLLATE "C",
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
    -- The error the last nack gave (dq_nack's error, its last 4,000
    -- characters); NULL when it gave none. An offer that resets attempts
    -- clears it too. Since 1.1 (last: ALTER TABLE adds it there).
    last_error text,
    -- Since 1.1 (ALTER TABLE adds both there, instantly): the message's
    -- channel, '' for none (the queue's unchanneled group), and priority.
    -- A plain message (channel '' and priority 0) is in dq_messages_due;
    -- every other one in dq_messages_grouped (42_groups.sql).
    channel text COLLATE "C" NOT NULL DEFAULT '',
    priority integer NOT NULL DEFAULT 0,
    -- Since 1.2: the metadata the message carries (a JSON object: dq_send's
    -- or dq_offer's headers); NULL: none.
    headers jsonb,
    -- Since 1.2: when its current or last delivery began, and the due time
    -- it was delivered at; NULL: never delivered (or delivered before 1.2).
    -- A lease writes them in the row it rewrites anyway; a message that
    -- leaves a queue with history takes them along (57_history.sql).
    leased_at timestamptz,
    leased_due_at timestamptz
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

-- The hot functions (offer, poll, ack, nack, extend, next_due) run with
-- plan_cache_mode = force_generic_plan: their statements are index lookups
-- whose best plan does not depend on the arguments, and letting plpgsql plan
-- them anew on every call (custom plans) cost more than running them: a
-- one-message poll took 0.25 ms of server time instead of 0.12 ms.
-- And with enable_seqscan = off (1.2): a session keeps a generic plan until
-- the table's statistics change, so one that first called them while the
-- table was nearly empty kept scanning the whole table in every ack and
-- lease (cheaper than an index for one page) as it grew, until the first
-- autovacuum: 91 ms against 2.1 ms for a poll of 100 and its ack beside
-- 200,000 messages. Every statement of theirs has an index (or row
-- addresses) to go by.
-- And with jit = off (1.2), wherever enable_seqscan is off: a statement
-- that runs inside these functions and must scan a table anyway (a fold of
-- dq_counts, a user's trigger on dq_messages) is priced at 10^10 under
-- enable_seqscan = off, above every JIT threshold, and was compiled on
-- every run: 60-90 ms a fold. pgtap/00_install.sql checks the pairing.
-- pgtap/10_plans.sql checks that these plans stay on the indexes.

-- One message per (queue, key): what offers decide created / updated /
-- ignored by. Keyless messages (key NULL) have no entry (1.2; before, a
-- constraint over every row).
CREATE UNIQUE INDEX dq_messages_queue_key ON dq_messages (queue, key)
WHERE key IS NOT NULL;

-- The poll path of plain messages: due messages of one queue, earliest
-- first, ties by id. Polls and dq_next_due read only the head of one queue's
-- range, so their cost does not grow with the number of delayed messages or
-- other queues. Its entries are unique (id is in them), so deduplication
-- never merges any: turned off, a full page splits at once instead of first
-- trying.
CREATE INDEX dq_messages_due ON dq_messages (queue, due_at, id)
WITH (deduplicate_items = off)
WHERE channel = '' AND priority = 0;

-- The poll path of every other message: per group (channel), highest
-- priority first, then due time. A poll finds a group's next message with
-- one probe per priority level the group uses (42_groups.sql).
CREATE INDEX dq_messages_grouped ON dq_messages (queue, channel, priority DESC, due_at, id)
WITH (deduplicate_items = off)
WHERE channel <> '' OR priority <> 0;

-- The leases of channeled messages by their end: a channel's valid leases
-- are the entries after now, so counting them against max_concurrency reads
-- at most that many entries, and an expired lease holds no slot.
CREATE INDEX dq_messages_leases ON dq_messages (queue, channel, due_at)
WHERE lock_token IS NOT NULL AND channel <> '';

COMMENT ON TABLE dq_messages IS
'pgdq messages. Use the dq_* functions; the layout is internal and may change.';

-- What a poll hands to a consumer (docs/sql-reference.md).
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
    lease_until timestamptz,
    channel text,       -- since 1.1; NULL: none
    priority integer,   -- since 1.1
    headers jsonb       -- since 1.2; NULL: none
);

-- The time dq.now pins the clock to (STRICT: never called when it is unset);
-- 22023 unless it is a timestamp in the readable range (dq__valid_time).
-- VOLATILE, as every raising function is (20_checks.sql): dq_now, VOLATILE
-- too, inlines all the same.
CREATE FUNCTION dq__pinned_now(setting text) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE STRICT
AS $$
DECLARE
    v_at timestamptz;
BEGIN
    BEGIN
        v_at := setting::pg_catalog.timestamptz;
    EXCEPTION WHEN data_exception THEN  -- unparsable or out of range
        v_at := NULL;
    END;
    IF v_at IS NULL OR NOT "public".dq__valid_time(v_at) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format(
                'pgdq: dq.now must be a finite timestamp in years 1 to 9999 UTC, got %L', setting
            );
    END IF;
    RETURN v_at;
END
$$;

-- The one clock: dq.now when set and non-empty (tests), else the wall clock.
-- Schema-qualified rather than pinned, so that it inlines into its callers.
CREATE FUNCTION dq_now() RETURNS timestamptz
LANGUAGE sql VOLATILE
AS $$
    SELECT coalesce(
        "public".dq__pinned_now(nullif(pg_catalog.current_setting('dq.now', true), '')),
        pg_catalog.clock_timestamp()
    )
$$;

-- The installed package version.
CREATE FUNCTION dq_version() RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT '1.3.0'::text $$;

-- Per-queue settings; a queue without a row has the defaults.
CREATE TABLE dq_queues (
    queue text COLLATE "C" PRIMARY KEY,
    -- The most deliveries a message of this queue gets: a due message that
    -- has had this many is moved to the dead letters by the next poll instead
    -- of being delivered again (its consumers kept dying). NULL: no limit.
    max_attempts integer CONSTRAINT dq_queues_max_attempts CHECK (max_attempts > 0),
    -- Since 1.2 (dq_pause): when the queue was paused; NULL: it is not.
    -- Polls of a paused queue lease nothing.
    paused_at timestamptz,
    -- Since 1.2 (dq_retain): how long a record of each message that leaves
    -- the queue is kept; NULL: none is made. history_keep is the period its
    -- records age out by: the last retain set, kept when it is turned off;
    -- history_from the finish before which records are gone for good
    -- whatever a later period says (those aged out when it changed).
    retain interval CONSTRAINT dq_queues_retain CHECK (retain > '0' AND retain <= '3650 days'),
    history_keep interval,
    history_from timestamptz
);

COMMENT ON TABLE dq_queues IS
'pgdq per-queue settings. Use dq_configure; the layout is internal and may change.';

-- Messages given up on: moved here by dq_dead_letter (the consumer's
-- verdict) or by a poll that found their attempts used up. One row per
-- (queue, key): a key that fails again replaces its earlier dead letter;
-- one per message for keyless messages (key NULL, since 1.2).
CREATE TABLE dq_dead_letters (
    queue text COLLATE "C" NOT NULL,
    key text COLLATE "C",
    id bigint NOT NULL,  -- the message's id when it failed
    payload jsonb NOT NULL,
    state jsonb,
    scheduled_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    attempts integer NOT NULL,
    error text,
    failed_at timestamptz NOT NULL,
    -- Since 1.1: a redriven message goes back to its channel and priority.
    channel text COLLATE "C" NOT NULL DEFAULT '',
    priority integer NOT NULL DEFAULT 0,
    headers jsonb  -- since 1.2, as in dq_messages
);

-- One dead letter per (queue, key); keyless ones (key NULL) are told apart
-- by id (1.2; before, the primary key).
CREATE UNIQUE INDEX dq_dead_letters_queue_key ON dq_dead_letters (queue, key)
WHERE key IS NOT NULL;

-- Without a primary key, logical replication identifies a dead letter by
-- all its columns: a publication of the table (FOR ALL TABLES, say) refuses
-- updates and deletes of a table with no replica identity.
ALTER TABLE dq_dead_letters REPLICA IDENTITY FULL;

-- Listing a queue's dead letters, oldest failure first.
CREATE INDEX dq_dead_letters_failed ON dq_dead_letters (queue, failed_at, key);

-- Snapshot reads of every queue's dead letters by id range (dq_read_*).
-- Not unique: a 1.0.0 database restored from a dump reused ids.
CREATE INDEX dq_dead_letters_id ON dq_dead_letters (id);

COMMENT ON TABLE dq_dead_letters IS
'pgdq dead letters. Use the dq_dead_* functions; the layout is internal and may change.';

-- Recurring schedules kept by the database (dq_schedule_set): the polls of a
-- queue turn its due occurrences into ordinary messages, so no scheduler
-- process has to run. next_at is the next occurrence not yet turned into a
-- message, or while the schedule fails the time of its next attempt; NULL
-- (since 1.2) once the schedule has ended: its next occurrence (or attempt)
-- would fall after year 9999 UTC, outside the readable range.
CREATE TABLE dq_schedules (
    queue text COLLATE "C" NOT NULL,
    name text COLLATE "C" NOT NULL,  -- the key prefix of its occurrences
    expression text NOT NULL,
    timezone text NOT NULL,
    payload jsonb NOT NULL,
    config_hash text NOT NULL,       -- of expression, timezone and payload
    max_missed integer NOT NULL,     -- occurrences delivered when several are due at once
    next_at timestamptz,
    -- Since 1.1: a poll that fails to materialise the schedule keeps the
    -- error and retries later (64_schedules.sql); a success clears them.
    last_error text,                 -- '<message> (SQLSTATE <code>)'
    last_error_at timestamptz,
    failures integer NOT NULL DEFAULT 0,  -- in a row
    missed_from timestamptz,         -- while failing: the first occurrence not yet delivered
    CONSTRAINT dq_schedules_pkey PRIMARY KEY (queue, name)
);

-- Polls look for their queue's due schedules: one probe of this index.
CREATE INDEX dq_schedules_next ON dq_schedules (queue, next_at);

COMMENT ON TABLE dq_schedules IS
'pgdq schedules. Use the dq_schedule* functions; the layout is internal and may change.';

-- The groups of the queues that use channels or priorities (since 1.1): one
-- row per channel ('' for the queue's unchanneled group) holding its limits
-- and its place in the turn order. A queue with no row here is plain: its
-- polls never look at this table beyond one probe (42_groups.sql explains
-- the turn rule and how rows are kept exact without a counter that drifts).
CREATE TABLE dq_groups (
    queue text COLLATE "C" NOT NULL,
    channel text COLLATE "C" NOT NULL,
    -- limits (dq_channel_set); NULL: none
    max_concurrency integer CONSTRAINT dq_groups_max_concurrency CHECK (max_concurrency >= 1),
    min_interval interval CONSTRAINT dq_groups_min_interval CHECK (min_interval > '0'),
    -- the dq_turns value of its most recent lease, so the group leased
    -- longest ago comes first; NULL: never leased
    turn bigint,
    last_leased_at timestamptz,
    -- no later than the due time of its next message: orders the groups
    -- never leased from (offers lower it, polls correct it)
    first_due timestamptz NOT NULL,
    -- NULL: polls look at the group; otherwise no message of it can be
    -- eligible before then (offers and freed slots lower it)
    wake_at timestamptz,
    CONSTRAINT dq_groups_pkey PRIMARY KEY (queue, channel)
);

-- The turn order of the groups polls look at.
CREATE INDEX dq_groups_turns ON dq_groups (queue, turn NULLS FIRST, first_due, channel)
WHERE wake_at IS NULL;

-- The groups waiting for a time, by that time.
CREATE INDEX dq_groups_wakes ON dq_groups (queue, wake_at)
WHERE wake_at IS NOT NULL;

-- Turns: taking a message gives its group the next value.
CREATE SEQUENCE dq_turns AS bigint;

COMMENT ON TABLE dq_groups IS
'pgdq channels and turn order. Use the dq_channel* functions; the layout is internal and may change.';

-- Counts behind the overview (1.2): how many messages each queue holds, by
-- due time, kept by every write, so that dq_stats() of every queue costs the
-- counts and a few index probes per queue instead of a pass over the table
-- (1 s at 1,000,000 messages in 1.1).
--
-- dq_counts holds deltas, never a row that writers update: each statement
-- that inserts, deletes or moves messages appends one row per (queue, due
-- bin, leased) it changed, with the net change. Two writers never touch the
-- same row, so counting adds no lock and no wait to any write. A reader sums
-- the rows. Now and then (one statement in 4,096) a writer folds the rows
-- it can lock into their sums (dq__fold_counts), skipping rows another
-- folder holds, so that readers sum a few thousand rows at most. A fold
-- costs about 1.5 microseconds per row it sums (and reads the dead rows of
-- earlier folds until vacuum frees them): a few milliseconds, about a
-- microsecond per statement at this rate.
--
-- The counts are exact at any snapshot: a delta commits or rolls back with
-- the statement that wrote it. Triggers write them (12_counts.sql is the one
-- place), so every path that writes messages counts, pgdq's functions and
-- any other. A due bin is 10 minutes of due_at (dq__due_bin): the overview
-- sums whole bins and counts only the current bin's messages still ahead of
-- now in the poll indexes (50_manage.sql).
CREATE TABLE dq_counts (
    queue text COLLATE "C" NOT NULL,
    -- the start of the bin holding the messages' due_at; '-infinity' for
    -- bins folded more than 7 days after they ended (all due long ago)
    due_bin timestamptz NOT NULL,
    -- lock_token IS NOT NULL (leased, or a lease that expired)
    leased boolean NOT NULL,
    n bigint NOT NULL
) WITH (
    -- every fold leaves the rows it summed dead: vacuum as soon as
    -- autovacuum comes by, with no cost delay, so that the table (which
    -- folds and dq_stats() read whole) stays a few pages
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_cost_delay = 0
);

COMMENT ON TABLE dq_counts IS
'pgdq message counts by queue and due time (deltas, summed on read). Kept by triggers on dq_messages; internal.';

-- The width of a bin (dq__due_bin).
CREATE FUNCTION dq__due_bin_width() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT '10 minutes'::pg_catalog.interval;
$$;

-- The 10-minute bin of a due time: its start.
CREATE FUNCTION dq__due_bin(due_at timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT pg_catalog.date_bin("public".dq__due_bin_width(), due_at, '2000-01-01 00:00+00');
$$;

-- Sum the count rows this transaction can lock into one row per (queue, bin,
-- leased); bins that ended more than 7 days ago become one '-infinity' bin
-- per queue (dq_stats reads such bins as due). Never waits: rows another
-- transaction holds (a concurrent fold) are left for later.
CREATE FUNCTION dq__fold_counts() RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
-- No JIT: a fold runs inside the writer's statement, and so under its
-- settings; the hot functions set enable_seqscan = off, which prices the
-- fold's (unavoidable) scan of dq_counts above jit_above_cost. Compiling it
-- took 60-90 ms a fold, a fifth of every single send's time at saturation.
SET jit = off
AS $$
    WITH taken AS (
        DELETE FROM "public".dq_counts AS c
        WHERE c.ctid = ANY (ARRAY(SELECT l.ctid FROM "public".dq_counts AS l FOR UPDATE SKIP LOCKED))
        RETURNING c.queue, c.due_bin, c.leased, c.n
    ),
    binned AS (
        SELECT
            t.queue,
            t.due_bin < statement_timestamp() - interval '7 days' - "public".dq__due_bin_width() AS folded,
            t.due_bin, t.leased, t.n
        FROM taken AS t
    )
    INSERT INTO "public".dq_counts (queue, due_bin, leased, n)
    SELECT
        b.queue,
        CASE WHEN b.folded THEN '-infinity' ELSE b.due_bin END,
        b.leased AND NOT b.folded,
        sum(b.n)
    FROM binned AS b
    GROUP BY 1, 2, 3
    HAVING sum(b.n) <> 0;
$$;

-- Who sees the counts: roles granted SELECT (the README's consumer role,
-- for dq_stats) that row-level security does not isolate. A role under
-- policies on dq_messages (docs/security.md) sees no count, and its
-- dq_stats() reads the messages its policies let it see, as in 1.1.
ALTER TABLE dq_counts ENABLE ROW LEVEL SECURITY;
CREATE POLICY dq_counts_unless_isolated ON dq_counts
USING ((SELECT NOT pg_catalog.row_security_active('"public".dq_messages'::regclass)));

-- The trigger functions run as pgdq's owner (SECURITY DEFINER, the only
-- ones: pgtap/00_install.sql), so that a role that may write messages needs
-- no right on dq_counts and no caller can write counts of its own. They
-- take no argument, and count only when called as pgdq's own count triggers
-- (dq__is_count_trigger).

-- Whether a trigger call is one of pgdq's own count triggers: AFTER, FOR
-- EACH STATEMENT, on dq_messages, by its name. A role may attach a trigger
-- function to a table of its own, or (with the TRIGGER right) add another
-- trigger to dq_messages that would count twice.
CREATE FUNCTION dq__is_count_trigger(relid oid, name text, level text, fired text) RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$
    SELECT relid OPERATOR(pg_catalog.=) '"public".dq_messages'::pg_catalog.regclass::pg_catalog.oid
        AND level OPERATOR(pg_catalog.=) 'STATEMENT'
        AND fired OPERATOR(pg_catalog.=) 'AFTER'
        AND name OPERATOR(pg_catalog.=) ANY (
            ARRAY['dq_count_inserted', 'dq_count_deleted', 'dq_count_updated', 'dq_count_truncated']
        );
$$;

-- Raise: a count trigger function was called as anything but one of pgdq's
-- count triggers (dq__is_count_trigger).
CREATE FUNCTION dq__count_refuse(relid oid, name text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'pgdq counts only through its own triggers on dq_messages, not % on %', name, relid::regclass
    USING ERRCODE = '42501';
END
$$;

-- After an INSERT into or a DELETE from dq_messages: count the rows it
-- inserted, or uncount the rows it deleted (both triggers name them
-- changed_rows); now and then fold the counts. A delete with an outcome
-- (57_history.sql) is recorded in the history of the queues that keep one.
CREATE FUNCTION dq__count_rows() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_outcome text;
    v_now timestamptz;
    v_recorded bigint;
    v_queues text[];
BEGIN
    IF NOT "public".dq__is_count_trigger(TG_RELID, TG_NAME::text, TG_LEVEL, TG_WHEN) THEN
        PERFORM "public".dq__count_refuse(TG_RELID, TG_NAME::text);
    END IF;
    INSERT INTO "public".dq_counts (queue, due_bin, leased, n)
    SELECT
        r.queue, "public".dq__due_bin(r.due_at), r.lock_token IS NOT NULL,
        CASE TG_OP WHEN 'DELETE' THEN -count(*) ELSE count(*) END
    FROM changed_rows AS r
    GROUP BY 1, 2, 3;
    -- a fold in REPEATABLE READ or SERIALIZABLE could fail on a row that a
    -- concurrent fold took: writers there never fold
    IF random() < 1.0 / 4096 AND current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM "public".dq__fold_counts();
    END IF;
    IF TG_OP = 'DELETE' THEN
        v_outcome := "public".dq__deleting_outcome();
    END IF;
    IF v_outcome IS NULL THEN
        RETURN NULL;
    END IF;

    -- History (57_history.sql): the records, then their deltas, in one
    -- statement that writes nothing for a queue without retention; stamped
    -- by the history clock (never ahead of the server's)
    v_now := "public".dq__history_now();
    WITH kept AS (
        INSERT INTO "public".dq_history (
            queue, key, id, outcome, payload, state, channel, priority, created_at, scheduled_at,
            last_leased_at, finished_at, attempts, last_error, headers, lateness
        )
        SELECT r.queue, r.key, r.id, v_outcome, r.payload, r.state, r.channel, r.priority,
            r.created_at, r.scheduled_at, r.leased_at, v_now, r.attempts, r.last_error, r.headers,
            greatest(r.leased_at - r.leased_due_at, interval '0')
        FROM changed_rows AS r
        -- the queues keeping history, read once (not a probe per row)
        WHERE r.queue = ANY (ARRAY(SELECT q.queue FROM "public".dq_queues AS q WHERE q.retain IS NOT NULL))
        RETURNING queue, last_leased_at, lateness
    ),
    -- one outcome a statement; lateness and run time of delivered messages
    -- that were acked or are dead (dq__history_measures, spelled out here)
    measured AS (
        SELECT k.queue, left(v_outcome, 1)::"char" AS measure, 0::smallint AS bin
        FROM kept AS k
        UNION ALL
        SELECT k.queue, 'l', "public".dq__duration_bin(k.lateness)
        FROM kept AS k
        WHERE v_outcome IN ('acked', 'dead') AND k.last_leased_at IS NOT NULL
        UNION ALL
        SELECT k.queue, 'r', "public".dq__duration_bin(v_now - k.last_leased_at)
        FROM kept AS k
        WHERE v_outcome IN ('acked', 'dead') AND k.last_leased_at IS NOT NULL
    ),
    tallied AS (
        INSERT INTO "public".dq_history_deltas (queue, at, measure, bin, n)
        SELECT m.queue, date_bin('1 second', v_now, 'epoch'), m.measure, m.bin, count(*)
        FROM measured AS m
        GROUP BY m.queue, m.measure, m.bin
    )
    SELECT count(*), array_agg(DISTINCT k.queue) INTO v_recorded, v_queues
    FROM kept AS k;
    IF v_recorded > 0 AND current_setting('transaction_isolation') = 'read committed' THEN
        IF random() < 1.0 / 256 THEN
            PERFORM "public".dq__fold_history();
        END IF;
        -- twice, on average, what recording adds, of these queues only, and
        -- never more than max(1024, 2 n) records a statement
        IF random() < v_recorded / 512.0 THEN
            PERFORM "public".dq__expire_history(v_queues, greatest(1024, 2 * v_recorded)::integer);
        END IF;
    END IF;
    RETURN NULL;
END
$$;

-- After an UPDATE of dq_messages: move the rows whose bin or lease changed
-- (a lease, nack, extend or offer that moves due_at to another bin).
CREATE FUNCTION dq__count_updated() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT "public".dq__is_count_trigger(TG_RELID, TG_NAME::text, TG_LEVEL, TG_WHEN) THEN
        PERFORM "public".dq__count_refuse(TG_RELID, TG_NAME::text);
    END IF;
    INSERT INTO "public".dq_counts (queue, due_bin, leased, n)
    SELECT d.queue, d.due_bin, d.leased, sum(d.n)
    FROM (
        SELECT r.queue, "public".dq__due_bin(r.due_at) AS due_bin, r.lock_token IS NOT NULL AS leased, 1 AS n
        FROM new_rows AS r
        UNION ALL
        SELECT r.queue, "public".dq__due_bin(r.due_at), r.lock_token IS NOT NULL, -1
        FROM old_rows AS r
    ) AS d
    GROUP BY 1, 2, 3
    HAVING sum(d.n) <> 0;
    RETURN NULL;
END
$$;

-- After a TRUNCATE of dq_messages: no messages, no counts.
CREATE FUNCTION dq__count_truncated() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT "public".dq__is_count_trigger(TG_RELID, TG_NAME::text, TG_LEVEL, TG_WHEN) THEN
        PERFORM "public".dq__count_refuse(TG_RELID, TG_NAME::text);
    END IF;
    -- TRUNCATE, not DELETE: no count a concurrent fold or an older snapshot
    -- holds survives it
    BEGIN
        TRUNCATE "public".dq_counts;
    EXCEPTION WHEN object_in_use THEN
        -- The same statement truncates dq_counts too (TRUNCATE dq_messages,
        -- dq_counts), or a cursor of this session reads it. Then the lock a
        -- TRUNCATE would take, and a DELETE with a snapshot taken after it:
        -- every count, none a fold adds later. A transaction with an older
        -- snapshot (REPEATABLE READ, SERIALIZABLE) cannot: it fails as before.
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE;
        END IF;
        LOCK TABLE "public".dq_counts IN ACCESS EXCLUSIVE MODE;
        DELETE FROM "public".dq_counts;
    END;
    RETURN NULL;
END
$$;

CREATE TRIGGER dq_count_inserted AFTER INSERT ON dq_messages
REFERENCING NEW TABLE AS changed_rows
FOR EACH STATEMENT EXECUTE FUNCTION dq__count_rows();

CREATE TRIGGER dq_count_deleted AFTER DELETE ON dq_messages
REFERENCING OLD TABLE AS changed_rows
FOR EACH STATEMENT EXECUTE FUNCTION dq__count_rows();

CREATE TRIGGER dq_count_updated AFTER UPDATE ON dq_messages
REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION dq__count_updated();

CREATE TRIGGER dq_count_truncated AFTER TRUNCATE ON dq_messages
FOR EACH STATEMENT EXECUTE FUNCTION dq__count_truncated();

-- Argument checks and lock tokens, shared by every public function.
-- Internal helpers are named dq__* (two underscores) and are not part of the SQL API.
-- Each argument rule has one checker here (dq__check_*: raises 22004/22023
-- naming the argument) and, where a hot path needs it, one inlinable test
-- (dq__valid_*: true or false); every limit is written once.
--
-- Volatility: every function that can raise for bad input, directly or by
-- calling one that can, is VOLATILE, and so is a LANGUAGE sql wrapper of one
-- (it inlines into the call it wraps). The planner runs an IMMUTABLE call
-- with constant arguments ahead of time, and a STABLE one while estimating,
-- even one that a CASE or WHERE would never reach, and would raise for it;
-- PostgreSQL 18 plans a LANGUAGE sql function's statements with its
-- arguments as constants, so `SELECT dq__check_queue(queue) WHERE queue IS
-- NOT NULL` raised for a NULL queue (issue 27). A VOLATILE call is never run
-- early. The tests that never raise (dq__valid_*) stay IMMUTABLE or STABLE
-- and inline; public functions keep the volatility their users see
-- (pgtap/22_volatility.sql checks all of this).
--
-- Naming, in every function of sql/src: parameters carry their API names,
-- with no prefix (queue, key, max_count, now_at), internal helpers' too;
-- where one could be read as a column, the function name qualifies it
-- (dq_offer.key), under `#variable_conflict use_column` in plpgsql. Locals
-- are v_*. Result columns are the API's names; a function whose result
-- column would repeat an argument's name is LANGUAGE sql (plpgsql refuses it).
-- These helpers sit on every hot path, so instead of pinning search_path
-- (a SET clause costs microseconds per call and blocks inlining) they
-- schema-qualify every function and operator they use; the other functions
-- pin search_path to pg_catalog, pg_temp and qualify pgdq's own objects, so
-- nothing a role creates in pgdq's schema is ever called (docs/security.md).

-- Raise 22004 naming the argument when is_null. (Callers pass `x IS NULL`:
-- a polymorphic helper could be outbid by an exact-type overload that a role
-- allowed to CREATE in pgdq's schema plants there; see docs/security.md.)
CREATE FUNCTION dq__null_check(is_null boolean, arg_name text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF is_null THEN
        RAISE EXCEPTION USING
            ERRCODE = '22004',
            MESSAGE = pg_catalog.format('pgdq: %s must not be NULL', arg_name);
    END IF;
END
$$;

-- Raise 22004/22023 unless name is non-NULL text of 1..max_length characters.
CREATE FUNCTION dq__check_name(
    name text, arg_name text, max_length integer
) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_length integer := pg_catalog.length(name);
BEGIN
    PERFORM "public".dq__null_check(name IS NULL, arg_name);
    IF v_length OPERATOR(pg_catalog.<) 1
        OR v_length OPERATOR(pg_catalog.>) max_length THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format(
                'pgdq: %s must be 1 to %s characters long, got %s',
                arg_name, max_length, v_length
            );
    END IF;
END
$$;

-- True when name is non-NULL text of 1..max_length characters. Hot paths
-- test this (it inlines) and call the raising checks only when it fails.
CREATE FUNCTION dq__valid_name(name text, max_length integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT coalesce(
        pg_catalog.length(name) OPERATOR(pg_catalog.>=) 1
        AND pg_catalog.length(name) OPERATOR(pg_catalog.<=) max_length,
        FALSE
    )
$$;

-- The longest queue name, in characters (docs/sql-reference.md, Names).
CREATE FUNCTION dq__queue_max_length() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 100::pg_catalog.int4 $$;

-- The longest message key, in characters (docs/sql-reference.md, Names).
CREATE FUNCTION dq__key_max_length() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 200::pg_catalog.int4 $$;

-- True when queue follows the queue name rule (inlines, for hot paths).
CREATE FUNCTION dq__valid_queue(queue text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT "public".dq__valid_name(queue, "public".dq__queue_max_length()) $$;

-- Raise 22004/22023 unless queue follows the queue name rule.
CREATE FUNCTION dq__check_queue(queue text) RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT "public".dq__check_name(queue, 'queue', "public".dq__queue_max_length()) $$;

-- True when key follows the key rule (inlines, for hot paths).
CREATE FUNCTION dq__valid_key(key text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT "public".dq__valid_name(key, "public".dq__key_max_length()) $$;

-- Raise 22004/22023 naming arg_name unless key follows the key rule.
CREATE FUNCTION dq__check_key(key text, arg_name text) RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT "public".dq__check_name(key, arg_name, "public".dq__key_max_length()) $$;

-- The longest channel name, in characters (docs/sql-reference.md, Names).
CREATE FUNCTION dq__channel_max_length() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 100::pg_catalog.int4 $$;

-- True when channel is NULL (none) or follows the channel name rule (inlines).
CREATE FUNCTION dq__valid_channel(channel text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT channel IS NULL
        OR "public".dq__valid_name(channel, "public".dq__channel_max_length())
$$;

-- Raise 22023 naming arg_name unless channel is NULL or follows the rule.
CREATE FUNCTION dq__check_channel(channel text, arg_name text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF channel IS NOT NULL THEN
        PERFORM "public".dq__check_name(channel, arg_name, "public".dq__channel_max_length());
    END IF;
END
$$;

-- The most characters of a consumer's error a message keeps (dq_nack keeps
-- the last ones: a traceback ends with the exception).
CREATE FUNCTION dq__error_max_length() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 4000::pg_catalog.int4 $$;

-- Raise 22004/22023 naming arg_name unless value is non-NULL and low..high.
CREATE FUNCTION dq__check_between(
    value integer, arg_name text, low integer, high integer
) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM "public".dq__null_check(value IS NULL, arg_name);
    IF value OPERATOR(pg_catalog.<) low OR value OPERATOR(pg_catalog.>) high THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format('pgdq: %s must be %s to %s, got %s', arg_name, low, high, value);
    END IF;
END
$$;

-- Raise 22023 naming arg_name unless value is one of allowed (NULL passes).
CREATE FUNCTION dq__check_one_of(value text, arg_name text, allowed text[]) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF NOT value OPERATOR(pg_catalog.=) ANY(allowed) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format(
                'pgdq: %s must be one of ''%s'', got %L',
                arg_name, pg_catalog.array_to_string(allowed, ''', '''), value
            );
    END IF;
END
$$;

-- True when a message with this lock_token and due_at is leased at now_at:
-- a lease that ended makes the message ready again (10_storage.sql).
CREATE FUNCTION dq__is_leased(
    lock_token uuid, due_at timestamptz, now_at timestamptz
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT lock_token IS NOT NULL AND due_at OPERATOR(pg_catalog.>) now_at $$;

-- True for every message: the predicates of the two poll indexes
-- (10_storage.sql), which between them hold every message, OR'd. A query
-- of one queue's messages that adds it reads the queue's ranges of both
-- indexes (a BitmapOr) instead of the whole table: no index holds every
-- message since keyless ones left the key index (1.2). Inlines.
CREATE FUNCTION dq__in_poll_indexes(channel text, priority integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT (channel OPERATOR(pg_catalog.=) '' AND priority OPERATOR(pg_catalog.=) 0)
        OR channel OPERATOR(pg_catalog.<>) '' OR priority OPERATOR(pg_catalog.<>) 0
$$;

-- Raise 22004 naming the argument when the array is NULL (is_null) or has a
-- NULL element (first_null, its position: pg_catalog.array_position(arr, NULL)).
CREATE FUNCTION dq__check_elements(first_null integer, is_null boolean, arg_name text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM "public".dq__null_check(is_null, arg_name);
    IF first_null IS NOT NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = '22004',
            MESSAGE = pg_catalog.format('pgdq: %s[%s] must not be NULL', arg_name, first_null);
    END IF;
END
$$;

-- The readable range of times: from the start of year 1 to the end of year
-- 9999 UTC, what every common client library can read (Python's datetime,
-- Java's Instant in most drivers, JavaScript's Date). Every time a function
-- accepts, stores or returns lies in it (docs/sql-reference.md, Times).
-- The first time in the range.
CREATE FUNCTION dq__time_min() RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0001-01-01 00:00:00+00'::pg_catalog.timestamptz $$;

-- The first time after the range.
CREATE FUNCTION dq__time_end() RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '10000-01-01 00:00:00+00'::pg_catalog.timestamptz $$;

-- True when at is NULL or in the readable range (inlines, for hot paths).
CREATE FUNCTION dq__valid_time(at timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT at IS NULL
        OR (
            at OPERATOR(pg_catalog.>=) "public".dq__time_min()
            AND at OPERATOR(pg_catalog.<) "public".dq__time_end()
        )
$$;

-- The time in the readable range nearest to at (NULL stays NULL): what the
-- 1.2 step makes of times stored before the range was enforced.
CREATE FUNCTION dq__clamp_time(at timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN at OPERATOR(pg_catalog.<) "public".dq__time_min() THEN "public".dq__time_min()
        WHEN at OPERATOR(pg_catalog.>=) "public".dq__time_end()
            THEN '9999-12-31 23:59:59.999999+00'::pg_catalog.timestamptz
        ELSE at
    END
$$;

-- Raise 22023 naming arg_name unless at is NULL or in the readable range
-- (VOLATILE, as every raising check is: see Volatility above).
CREATE FUNCTION dq__check_time(at timestamptz, arg_name text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF NOT "public".dq__valid_time(at) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format(
                'pgdq: %s must be a time in years 1 to 9999 UTC, got %s', arg_name, at
            );
    END IF;
END
$$;

-- Raise 22023 naming the first element of ats outside the readable range
-- (NULL ones pass).
CREATE FUNCTION dq__check_time_elements(ats timestamptz[], arg_name text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_bad record;
BEGIN
    -- the usual batch has none: two scans in C before any unnest
    IF "public".dq__time_min() OPERATOR(pg_catalog.>) ANY(ats)
        OR "public".dq__time_end() OPERATOR(pg_catalog.<=) ANY(ats) THEN
        -- the element itself, named by its position (whatever the array's
        -- lower bound: a subscript would read another element)
        SELECT a.at, a.ord INTO v_bad
        FROM pg_catalog.unnest(ats) WITH ORDINALITY AS a (at, ord)
        WHERE NOT "public".dq__valid_time(a.at)
        ORDER BY a.ord
        LIMIT 1;
        PERFORM "public".dq__check_time(v_bad.at, pg_catalog.format('%s[%s]', arg_name, v_bad.ord));
    END IF;
END
$$;

-- True when a lease taken at now_at ends after now_at, within the readable
-- range (dq__valid_time). Hot paths test this (it inlines) and call
-- dq__check_lease only when it fails; CASE keeps the sum from overflowing.
-- STABLE, like timestamptz + interval: an IMMUTABLE one would not inline.
CREATE FUNCTION dq__valid_lease(lease interval, now_at timestamptz) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN lease OPERATOR(pg_catalog.>) '0'::pg_catalog.interval
            AND lease OPERATOR(pg_catalog.<) '1000 years'::pg_catalog.interval
            AND now_at OPERATOR(pg_catalog.<) "public".dq__time_end()
            THEN (now_at OPERATOR(pg_catalog.+) lease) OPERATOR(pg_catalog.>) now_at
                AND (now_at OPERATOR(pg_catalog.+) lease) OPERATOR(pg_catalog.<) "public".dq__time_end()
        ELSE FALSE
    END
$$;

-- Raise 22004/22023 unless a lease taken at now_at ends after now_at and
-- within the readable range (VOLATILE: see dq__check_time).
CREATE FUNCTION dq__check_lease(lease interval, now_at timestamptz) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_until timestamptz;
BEGIN
    PERFORM "public".dq__null_check(lease IS NULL, 'lease');
    IF lease OPERATOR(pg_catalog.<=) '0'::pg_catalog.interval THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format('pgdq: lease must be positive, got %s', lease);
    END IF;
    BEGIN
        v_until := now_at OPERATOR(pg_catalog.+) lease;
    EXCEPTION WHEN datetime_field_overflow THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format('pgdq: lease %s ends after year 9999 UTC', lease);
    END;
    IF v_until OPERATOR(pg_catalog.>=) "public".dq__time_end() THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format('pgdq: lease %s from %s ends after year 9999 UTC', lease, now_at);
    END IF;
    IF v_until OPERATOR(pg_catalog.<=) now_at THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format(
                'pgdq: lease must end after now, but %s from %s ends at %s', lease, now_at, v_until
            );
    END IF;
END
$$;

-- The proof of a poll's lock tokens: the random half of a v4 UUID (62
-- random bits), drawn once per poll, as an InitPlan of its UPDATE. Drawing
-- it per row cost 2.4 us a lease (gen_random_uuid() reads the system's
-- strong random source), a fifth of a batch poll's time. One proof per
-- poll keeps what tokens promise: a token of another poll (an earlier lease
-- of the same message, or another consumer's) never matches, and the only
-- holder of a poll's tokens is the consumer it answered.
CREATE FUNCTION dq__token_proof() RETURNS bytea
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT pg_catalog.substr(pg_catalog.uuid_send(pg_catalog.gen_random_uuid()), 9) $$;

-- The lock token of message id in a poll with proof (dq__token_proof): the
-- id in the first 8 bytes (so the row is found by primary key), the proof
-- in the last 8. Token helpers are schema-qualified instead of pinning
-- search_path, so the planner can inline them into the statements that use
-- them.
CREATE FUNCTION dq__token(id bigint, proof bytea) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    -- bytes, not hex text: a third less time per lease
    SELECT CAST(
        pg_catalog.encode(pg_catalog.int8send(id) OPERATOR(pg_catalog.||) proof, 'hex') AS pg_catalog.uuid
    )
$$;

-- A lock token for message id with a proof of its own: what 1.1's polls
-- drew per row. 1.2 calls dq__token(id, proof); this one stays for the calls
-- of 1.1's functions still running when the upgrade commits.
CREATE FUNCTION dq__token(id bigint) RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT "public".dq__token(id, "public".dq__token_proof()) $$;

-- The message id a lock token was issued for (see dq__token).
CREATE FUNCTION dq__token_id(token uuid) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT CAST(
        CAST(
            'x' OPERATOR(pg_catalog.||) pg_catalog.encode(
                pg_catalog.substr(pg_catalog.uuid_send(token), 1, 8), 'hex'
            ) AS pg_catalog.bit(64)
        ) AS pg_catalog.int8
    )
$$;

-- Producing: dq_offer and dq_offer_many.

-- True when an offer of (new_payload, new_at, new_channel, new_priority)
-- matches the stored version, so that it changes nothing: same payload,
-- channel ('' for none) and priority, and a NULL time matches any time.
-- Operators are schema-qualified so the planner can inline this function.
CREATE FUNCTION dq__same_offer(
    stored_payload jsonb,
    stored_at timestamptz,
    stored_channel text,
    stored_priority integer,
    new_payload jsonb,
    new_at timestamptz,
    new_channel text,
    new_priority integer
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT stored_payload OPERATOR(pg_catalog.=) new_payload
        AND (new_at IS NULL OR new_at OPERATOR(pg_catalog.=) stored_at)
        AND stored_channel OPERATOR(pg_catalog.=) new_channel
        AND stored_priority OPERATOR(pg_catalog.=) new_priority
$$;

-- Wake idle consumers of queue; sent at commit, one per queue per transaction.
CREATE FUNCTION dq__wake(queue text) RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT pg_catalog.pg_notify('dq_wakeup', queue) $$;

-- Wake idle consumers of queue (dq__wake) when a message this statement
-- wrote, due at written_at, is due no later than every other message of the
-- queue it can see: only then could a consumer sleeping until dq_next_due
-- oversleep. (For a message with no channel and priority 0; in a queue with
-- channels that compares it with the other such messages only, which can
-- wake consumers needlessly but never lets one oversleep.) Writes behind the head stay silent, so busy producers do not
-- serialise on the server's notification lock (docs/sql-reference.md, Wake-ups).
CREATE FUNCTION dq__wake_if_head(queue text, written_at timestamptz) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    -- plpgsql, not sql: its plan is cached per session instead of planned per call
    IF written_at OPERATOR(pg_catalog.<=) (
        SELECT m.due_at FROM "public".dq_messages AS m
        WHERE m.queue OPERATOR(pg_catalog.=) dq__wake_if_head.queue
            AND m.channel OPERATOR(pg_catalog.=) '' AND m.priority OPERATOR(pg_catalog.=) 0
        ORDER BY m.due_at
        LIMIT 1
    ) THEN
        PERFORM "public".dq__wake(queue);
    END IF;
END
$$;

-- Offer one message: 'created', 'updated' or 'ignored' (docs/sql-reference.md).
CREATE FUNCTION dq_offer(
    queue text,
    key text,
    payload jsonb,
    scheduled_at timestamptz DEFAULT NULL,
    can_update boolean DEFAULT TRUE,
    channel text DEFAULT NULL,
    priority integer DEFAULT 0,
    headers jsonb DEFAULT NULL  -- since 1.2
) RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
    v_at timestamptz := coalesce(dq_offer.scheduled_at, v_now);
    v_channel text := coalesce(dq_offer.channel, '');
    v_priority integer := coalesce(dq_offer.priority, 0);
    v_inserted boolean;
BEGIN
    -- one cheap test on the hot path; the checks say what is wrong
    IF NOT "public".dq__valid_queue(dq_offer.queue)
        OR NOT "public".dq__valid_key(dq_offer.key)
        OR dq_offer.payload IS NULL
        OR dq_offer.can_update IS NULL
        OR NOT "public".dq__valid_time(dq_offer.scheduled_at)
        OR NOT "public".dq__valid_channel(dq_offer.channel)
        OR NOT "public".dq__valid_headers(dq_offer.headers) THEN
        PERFORM "public".dq__check_queue(dq_offer.queue);
        PERFORM "public".dq__check_key(dq_offer.key, 'key');
        PERFORM "public".dq__null_check(dq_offer.payload IS NULL, 'payload');
        PERFORM "public".dq__null_check(dq_offer.can_update IS NULL, 'can_update');
        PERFORM "public".dq__check_time(dq_offer.scheduled_at, 'scheduled_at');
        PERFORM "public".dq__check_channel(dq_offer.channel, 'channel');
        PERFORM "public".dq__check_headers(dq_offer.headers, 'headers');
    END IF;

    -- ON CONFLICT makes concurrent offers of one key wait for each other
    -- instead of failing: one creates, the others update or ignore.
    -- (Headers take no part in the decision: an update replaces them.)
    INSERT INTO "public".dq_messages AS m (
        queue, key, payload, scheduled_at, due_at, created_at, channel, priority, headers
    )
    VALUES (dq_offer.queue, dq_offer.key, dq_offer.payload, v_at, v_at, v_now, v_channel, v_priority, dq_offer.headers)
    ON CONFLICT (queue, key) WHERE key IS NOT NULL DO UPDATE
        SET payload = excluded.payload,
            scheduled_at = excluded.scheduled_at,
            due_at = excluded.due_at,
            created_at = excluded.created_at,
            attempts = 0,
            state = NULL,
            last_error = NULL,
            lock_token = NULL,
            channel = excluded.channel,
            priority = excluded.priority,
            headers = excluded.headers,
            leased_at = NULL,
            leased_due_at = NULL
        WHERE dq_offer.can_update
            AND m.channel = excluded.channel  -- a move to another channel: below
            AND NOT "public".dq__same_offer(
                m.payload, m.scheduled_at, m.channel, m.priority,
                excluded.payload, dq_offer.scheduled_at, excluded.channel, excluded.priority
            )
    RETURNING m.xmax = 0 INTO v_inserted;  -- xmax is 0 on a fresh insert

    IF NOT FOUND THEN
        -- The message moves to another channel (the row is locked by now):
        -- dq_offer_many's replay also frees the slot it held in the old one.
        IF dq_offer.can_update AND EXISTS (
            SELECT FROM "public".dq_messages AS m
            WHERE m.queue = dq_offer.queue AND m.key = dq_offer.key AND m.channel <> v_channel
        ) THEN
            RETURN (
                SELECT o.outcome FROM "public".dq_offer_many(
                    dq_offer.queue, ARRAY[dq_offer.key], ARRAY[dq_offer.payload], ARRAY[dq_offer.scheduled_at],
                    TRUE, ARRAY[dq_offer.channel], ARRAY[v_priority], ARRAY[dq_offer.headers]
                ) AS o
            );
        END IF;
        RETURN 'ignored';
    END IF;
    IF v_channel = '' AND v_priority = 0 THEN
        PERFORM "public".dq__wake_if_head(dq_offer.queue, v_at);
    ELSE
        -- an update drops any lease: its slot may be free
        PERFORM "public".dq__groups_touch(
            dq_offer.queue, ARRAY[v_channel], ARRAY[v_at], ARRAY[NOT v_inserted], v_now
        );
        PERFORM "public".dq__wake_if_first(dq_offer.queue, v_at, v_now);
    END IF;
    RETURN CASE WHEN v_inserted THEN 'created' ELSE 'updated' END;
END
$$;

-- Replay a batch of offers key by key, in array order, as dq_offer would:
-- one row per element (elem_ord >= 1) with its outcome and the state it
-- leaves, plus whether it is its key's last element and whether the key ends
-- up written. stored_* give the current version of keys that already exist.
-- channels and priorities: NULL (or a NULL element) means none and 0.
-- Headers take no part in the outcome: final_headers are those of the last
-- element that created or updated its message (1.2).
CREATE FUNCTION dq__offer_chain(
    keys text[],
    payloads jsonb[],
    scheduled_ats timestamptz[],
    channels text[],
    priorities integer[],
    headers jsonb[],
    can_update boolean,
    now_at timestamptz,
    stored_keys text[],
    stored_payloads jsonb[],
    stored_ats timestamptz[],
    stored_channels text[],
    stored_priorities integer[],
    stored_headers jsonb[]
) RETURNS TABLE (
    elem_ord bigint,
    elem_key text,
    outcome text,
    final_payload jsonb,
    final_at timestamptz,
    final_channel text,
    final_priority integer,
    final_headers jsonb,
    is_last boolean,
    had_stored boolean,
    key_written boolean
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH elems AS (
        SELECT e.ord, e.k COLLATE "C" AS k, e.p, e.s,
            coalesce(e.c, '') AS c, coalesce(e.pr, 0) AS pr, e.h, false AS is_stored
        FROM unnest(keys, payloads, scheduled_ats, channels, priorities, headers)
            WITH ORDINALITY AS e (k, p, s, c, pr, h, ord)
        UNION ALL
        SELECT 0, s.k COLLATE "C", s.p, s.s, s.c, s.pr, s.h, true
        FROM unnest(stored_keys, stored_payloads, stored_ats, stored_channels, stored_priorities, stored_headers)
            AS s (k, p, s, c, pr, h)
    ),

    -- sets_at: the scheduled_at an element leaves behind when it sets one;
    -- NULL when it keeps the previous one (no time given, same payload).
    stepped AS (
        SELECT
            elems.*,
            row_number() OVER w = 1 AS is_first,
            lag(elems.p) OVER w AS prev_p,
            lag(elems.c) OVER w AS prev_c,
            lag(elems.pr) OVER w AS prev_pr,
            CASE
                WHEN elems.is_stored OR elems.s IS NOT NULL THEN elems.s
                WHEN row_number() OVER w = 1 THEN now_at
                WHEN elems.p <> lag(elems.p) OVER w
                    OR elems.c <> lag(elems.c) OVER w
                    OR elems.pr <> lag(elems.pr) OVER w THEN now_at
            END AS sets_at
        FROM elems
        WINDOW w AS (PARTITION BY elems.k ORDER BY elems.ord)
    ),

    -- at: the scheduled_at in force after each element (last one set).
    resolved AS (
        SELECT
            grouped.*,
            max(grouped.sets_at) OVER (
                PARTITION BY grouped.k, grouped.grp
            ) AS at
        FROM (
            SELECT
                stepped.*,
                count(stepped.sets_at) OVER (
                    PARTITION BY stepped.k ORDER BY stepped.ord
                ) AS grp
            FROM stepped
        ) AS grouped
    ),

    judged AS (
        SELECT
            resolved.*,
            CASE
                WHEN resolved.is_first THEN 'created'
                WHEN NOT can_update THEN 'ignored'
                WHEN "public".dq__same_offer(
                    resolved.prev_p, lag(resolved.at) OVER w, resolved.prev_c, resolved.prev_pr,
                    resolved.p, resolved.s, resolved.c, resolved.pr
                ) THEN 'ignored'
                ELSE 'updated'
            END AS outcome
        FROM resolved
        WINDOW w AS (PARTITION BY resolved.k ORDER BY resolved.ord)
    ),

    -- version: how many elements so far created or updated the message
    versioned AS (
        SELECT
            judged.*,
            count(*) FILTER (WHERE judged.outcome <> 'ignored') OVER w AS version
        FROM judged
        WINDOW w AS (PARTITION BY judged.k ORDER BY judged.ord)
    )

    SELECT
        versioned.ord,
        versioned.k,
        versioned.outcome,
        -- without can_update the first version stays
        CASE WHEN can_update THEN versioned.p ELSE first_value(versioned.p) OVER w END,
        CASE WHEN can_update THEN versioned.at ELSE first_value(versioned.at) OVER w END,
        CASE WHEN can_update THEN versioned.c ELSE first_value(versioned.c) OVER w END,
        CASE WHEN can_update THEN versioned.pr ELSE first_value(versioned.pr) OVER w END,
        -- the headers of the element that wrote the version in force
        first_value(versioned.h) OVER v,
        versioned.ord = max(versioned.ord) OVER k,
        bool_or(versioned.is_stored) OVER k,
        bool_or(NOT versioned.is_stored AND versioned.outcome <> 'ignored') OVER k
    FROM versioned
    WINDOW
        w AS (PARTITION BY versioned.k ORDER BY versioned.ord),
        k AS (PARTITION BY versioned.k),
        v AS (PARTITION BY versioned.k, versioned.version ORDER BY versioned.ord)
$$;

-- Raise 22004/22023 unless the offer_many arrays are usable (docs/sql-reference.md).
CREATE FUNCTION dq__check_offer_arrays(
    keys text[], payloads jsonb[], scheduled_ats timestamptz[], channels text[], priorities integer[],
    headers jsonb[]
) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_bad record;
BEGIN
    PERFORM "public".dq__null_check(keys IS NULL, 'keys');
    PERFORM "public".dq__null_check(payloads IS NULL, 'payloads');
    IF coalesce(array_ndims(keys), 1) > 1
        OR coalesce(array_ndims(payloads), 1) > 1
        OR coalesce(array_ndims(scheduled_ats), 1) > 1
        OR coalesce(array_ndims(channels), 1) > 1
        OR coalesce(array_ndims(priorities), 1) > 1
        OR coalesce(array_ndims(headers), 1) > 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'pgdq: keys, payloads, scheduled_ats, channels, priorities and headers must be one-dimensional arrays';
    END IF;
    IF cardinality(payloads) <> cardinality(keys)
        OR cardinality(scheduled_ats) <> cardinality(keys) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format(
                'pgdq: keys, payloads and scheduled_ats must have equal lengths, got %s, %s and %s',
                cardinality(keys), cardinality(payloads),
                coalesce(cardinality(scheduled_ats)::text, 'NULL')
            );
    END IF;
    IF cardinality(channels) <> cardinality(keys) OR cardinality(priorities) <> cardinality(keys) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format(
                'pgdq: channels and priorities must have as many elements as keys (%s), got %s and %s',
                cardinality(keys),
                coalesce(cardinality(channels)::text, 'NULL'), coalesce(cardinality(priorities)::text, 'NULL')
            );
    END IF;
    PERFORM "public".dq__check_elements(pg_catalog.array_position(keys, NULL), keys IS NULL, 'keys');
    PERFORM "public".dq__check_elements(pg_catalog.array_position(payloads, NULL), payloads IS NULL, 'payloads');
    PERFORM "public".dq__check_time_elements(scheduled_ats, 'scheduled_ats');
    -- elements named by position, whatever the arrays' lower bounds
    SELECT k.k, k.ord INTO v_bad
    FROM unnest(keys) WITH ORDINALITY AS k (k, ord)
    WHERE NOT "public".dq__valid_key(k.k)
    ORDER BY k.ord
    LIMIT 1;
    IF v_bad.ord IS NOT NULL THEN
        PERFORM "public".dq__check_key(v_bad.k, format('keys[%s]', v_bad.ord));
    END IF;
    IF cardinality(headers) <> cardinality(keys) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format(
                'pgdq: headers must be NULL or have as many elements as keys (%s), got %s',
                cardinality(keys), cardinality(headers)
            );
    END IF;
    PERFORM "public".dq__check_channel_elements(channels);
    PERFORM "public".dq__check_headers_elements(headers);
END
$$;

-- Raise 22023 naming the first element of channels that is not a channel
-- name, by its position (NULL elements pass: none).
CREATE FUNCTION dq__check_channel_elements(channels text[]) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_bad record;
BEGIN
    SELECT c.c, c.ord INTO v_bad
    FROM unnest(channels) WITH ORDINALITY AS c (c, ord)
    WHERE NOT "public".dq__valid_channel(c.c)
    ORDER BY c.ord
    LIMIT 1;
    IF v_bad.ord IS NOT NULL THEN
        PERFORM "public".dq__check_channel(v_bad.c, format('channels[%s]', v_bad.ord));
    END IF;
END
$$;

-- The usual batch, all of whose keys are new: insert it in key order with a
-- plain INSERT, which checks each key once as it adds the index entry,
-- where ON CONFLICT first probes the key index and then inserts
-- speculatively. True when written; false, with nothing written, when a key
-- exists or repeats (the caller then replays the batch key by key). Key
-- order, as everywhere: two batches inserting the same new keys wait for
-- each other instead of deadlocking.
CREATE FUNCTION dq__offer_new(
    queue text,
    keys text[],
    payloads jsonb[],
    scheduled_ats timestamptz[],
    channels text[],
    priorities integer[],
    headers jsonb[],
    now_at timestamptz
) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
BEGIN
    INSERT INTO "public".dq_messages (
        queue, key, payload, scheduled_at, due_at, created_at, channel, priority, headers
    )
    SELECT
        dq__offer_new.queue, e.k, e.p,
        coalesce(e.s, now_at), coalesce(e.s, now_at), now_at,
        coalesce(e.c, ''), coalesce(e.pr, 0), e.h
    FROM unnest(keys, payloads, scheduled_ats, channels, priorities, headers) AS e (k, p, s, c, pr, h)
    ORDER BY e.k COLLATE "C";
    RETURN TRUE;
EXCEPTION WHEN unique_violation THEN  -- a key exists or repeats: undone
    RETURN FALSE;
END
$$;

-- After a batch of offers wrote messages into queue (for each: channel,
-- priority, due time, and whether it updated one that existed; a NULL due
-- time: a lease the batch dropped in that channel): tell the groups of those
-- with a channel or a priority (dq__groups_touch) and wake idle consumers
-- when one of them comes first.
CREATE FUNCTION dq__offers_written(
    queue text,
    channels text[],
    priorities integer[],
    dues timestamptz[],
    updated boolean[],
    now_at timestamptz
) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_plain_first timestamptz;
    v_grouped_first timestamptz;
    v_channels text[];
    v_dues timestamptz[];
    v_updated boolean[];
BEGIN
    SELECT
        min(e.d) FILTER (WHERE coalesce(e.c, '') = '' AND coalesce(e.pr, 0) = 0),
        min(e.d) FILTER (WHERE coalesce(e.c, '') <> '' OR coalesce(e.pr, 0) <> 0),
        array_agg(coalesce(e.c, '')) FILTER (WHERE coalesce(e.c, '') <> '' OR coalesce(e.pr, 0) <> 0),
        array_agg(e.d) FILTER (WHERE coalesce(e.c, '') <> '' OR coalesce(e.pr, 0) <> 0),
        array_agg(coalesce(e.u, FALSE)) FILTER (WHERE coalesce(e.c, '') <> '' OR coalesce(e.pr, 0) <> 0)
    INTO v_plain_first, v_grouped_first, v_channels, v_dues, v_updated
    FROM unnest(channels, priorities, dues, updated) AS e (c, pr, d, u);
    IF v_plain_first IS NOT NULL THEN
        PERFORM "public".dq__wake_if_head(queue, v_plain_first);
    END IF;
    IF v_channels IS NOT NULL THEN
        -- an update drops any lease: its slot may be free
        PERFORM "public".dq__groups_touch(queue, v_channels, v_dues, v_updated, now_at);
    END IF;
    IF v_grouped_first IS NOT NULL THEN
        PERFORM "public".dq__wake_if_first(queue, v_grouped_first, now_at);
    END IF;
END
$$;

-- Offer a batch: one (key, outcome) row per element, in input order, exactly
-- as if dq_offer ran for each element in turn (docs/sql-reference.md).
CREATE FUNCTION dq_offer_many(
    queue text,
    keys text[],
    payloads jsonb[],
    scheduled_ats timestamptz[] DEFAULT NULL,
    can_update boolean DEFAULT TRUE,
    channels text[] DEFAULT NULL,
    priorities integer[] DEFAULT NULL,
    headers jsonb[] DEFAULT NULL  -- since 1.2
) RETURNS TABLE (key text, outcome text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
    v_queue text := dq_offer_many.queue;
    v_keys text[];           -- the distinct keys
    v_distinct boolean;      -- no key repeats in the batch
    v_new text[];
    v_stored_keys text[] := '{}';
    v_stored_payloads jsonb[];
    v_stored_ats timestamptz[];
    v_stored_channels text[];
    v_stored_priorities integer[];
    v_stored_headers jsonb[];
    v_stored_leased boolean[];   -- held by a valid lease
    v_first_at timestamptz;  -- the earliest due time written
    -- what was written: channel, priority, due time, whether it was an update
    v_channels text[] := '{}';
    v_priorities integer[] := '{}';
    v_dues timestamptz[] := '{}';
    v_updated boolean[] := '{}';
BEGIN
    PERFORM "public".dq__check_queue(v_queue);
    PERFORM "public".dq__null_check(can_update IS NULL, 'can_update');
    PERFORM "public".dq__check_offer_arrays(
        keys, payloads, scheduled_ats, channels, priorities, dq_offer_many.headers
    );

    -- The fast path runs in a subtransaction (its EXCEPTION block), so only
    -- a transaction's first write takes it: a transaction never holds more
    -- than one of pgdq's, far below the 64 a backend caches (past them every
    -- other session's snapshots slow down until the transaction ends).
    IF pg_current_xact_id_if_assigned() IS NULL
        AND "public".dq__offer_new(
            v_queue, keys, payloads, scheduled_ats, channels, priorities, dq_offer_many.headers, v_now
        ) THEN
        IF cardinality(keys) > 0 AND channels IS NULL AND priorities IS NULL THEN
            PERFORM "public".dq__wake_if_head(v_queue, CASE
                WHEN scheduled_ats IS NULL THEN v_now
                ELSE (SELECT min(coalesce(s.s, v_now)) FROM unnest(scheduled_ats) AS s (s))
            END);
        ELSIF cardinality(keys) > 0 THEN
            PERFORM "public".dq__offers_written(
                v_queue, channels, priorities,
                ARRAY(SELECT coalesce(e.s, v_now) FROM unnest(keys, scheduled_ats) AS e (k, s)),
                NULL::boolean[], v_now
            );
        END IF;
        RETURN QUERY SELECT k.k, 'created'::text FROM unnest(keys) AS k (k);
        RETURN;
    END IF;

    -- Some key exists or repeats: replay the batch key by key.
    v_keys := ARRAY(SELECT DISTINCT k.k FROM unnest(keys) AS k (k));
    v_distinct := cardinality(v_keys) = cardinality(keys);

    -- One pass over the distinct keys in key order: a missing key is created
    -- with its final state, an existing one is locked (DO UPDATE ... WHERE
    -- false locks the row and changes nothing). Every batch takes its locks
    -- in the same order, so concurrent batches never deadlock, and a row being
    -- deleted concurrently is waited for and then either created or locked.
    WITH candidates AS (
        -- distinct keys (the usual batch) need no replay
        SELECT e.k, e.p, coalesce(e.s, v_now) AS at, coalesce(e.c, '') AS c, coalesce(e.pr, 0) AS pr, e.h
        FROM unnest(keys, payloads, scheduled_ats, channels, priorities, dq_offer_many.headers) AS e (k, p, s, c, pr, h)
        WHERE v_distinct
        UNION ALL
        SELECT c.elem_key, c.final_payload, c.final_at, c.final_channel, c.final_priority, c.final_headers
        FROM "public".dq__offer_chain(
            keys, payloads, scheduled_ats, channels, priorities, dq_offer_many.headers, can_update, v_now,
            NULL::text[], NULL::jsonb[], NULL::timestamptz[], NULL::text[], NULL::integer[], NULL::jsonb[]
        ) AS c
        WHERE NOT v_distinct AND c.is_last
    ),

    inserted AS (
        INSERT INTO "public".dq_messages AS m (
            queue, key, payload, scheduled_at, due_at, created_at, channel, priority, headers
        )
        SELECT v_queue, c.k, c.p, c.at, c.at, v_now, c.c, c.pr, c.h
        FROM candidates AS c
        ORDER BY c.k COLLATE "C"
        ON CONFLICT (queue, key) WHERE key IS NOT NULL DO UPDATE
            SET payload = m.payload
            WHERE FALSE
        RETURNING m.key, m.due_at, m.channel, m.priority
    )

    SELECT
        coalesce(array_agg(i.key), '{}'), min(i.due_at),
        coalesce(array_agg(i.channel), '{}'), coalesce(array_agg(i.priority), '{}'),
        coalesce(array_agg(i.due_at), '{}'), coalesce(array_agg(FALSE), '{}')
    INTO v_new, v_first_at, v_channels, v_priorities, v_dues, v_updated
    FROM inserted AS i;

    IF cardinality(v_new) < cardinality(v_keys) THEN
        -- the other keys existed and are locked by now: read their versions
        SELECT
            coalesce(array_agg(m.key), '{}'),
            array_agg(m.payload),
            array_agg(m.scheduled_at),
            array_agg(m.channel),
            array_agg(m.priority),
            array_agg(m.headers),
            array_agg("public".dq__is_leased(m.lock_token, m.due_at, v_now))
        INTO v_stored_keys, v_stored_payloads, v_stored_ats, v_stored_channels, v_stored_priorities,
            v_stored_headers, v_stored_leased
        FROM "public".dq_messages AS m
        INNER JOIN unnest(v_keys) AS p (k) ON m.key = p.k
        WHERE m.queue = v_queue
            AND NOT EXISTS (SELECT FROM unnest(v_new) AS n (k) WHERE n.k = m.key);
    END IF;

    IF cardinality(v_stored_keys) > 0 THEN
        WITH updated AS (
            UPDATE "public".dq_messages AS m
            SET payload = c.final_payload,
                scheduled_at = c.final_at,
                due_at = c.final_at,
                created_at = v_now,
                attempts = 0,
                state = NULL,
                last_error = NULL,
                lock_token = NULL,
                channel = c.final_channel,
                priority = c.final_priority,
                headers = c.final_headers,
                leased_at = NULL,
                leased_due_at = NULL
            FROM "public".dq__offer_chain(
                keys, payloads, scheduled_ats, channels, priorities, dq_offer_many.headers, can_update, v_now,
                v_stored_keys, v_stored_payloads, v_stored_ats, v_stored_channels, v_stored_priorities,
                v_stored_headers
            ) AS c
            WHERE c.is_last AND c.had_stored AND c.key_written
                AND m.queue = v_queue AND m.key = c.elem_key
            RETURNING m.key, m.due_at, m.channel, m.priority
        ),

        -- what was written, and the leases the updates dropped in other
        -- channels (their slots are free: a NULL due time)
        written AS (
            SELECT u.channel AS c, u.priority AS pr, u.due_at AS d FROM updated AS u
            UNION ALL
            SELECT s.c, 0, NULL
            FROM unnest(v_stored_keys, v_stored_channels, v_stored_leased) AS s (k, c, leased)
            INNER JOIN updated AS u ON u.key = s.k
            WHERE s.leased AND s.c <> u.channel
        )

        SELECT
            least(v_first_at, min(w.d)),
            v_channels || coalesce(array_agg(w.c), '{}'),
            v_priorities || coalesce(array_agg(w.pr), '{}'),
            v_dues || coalesce(array_agg(w.d), '{}'),
            v_updated || coalesce(array_agg(TRUE), '{}')
        INTO v_first_at, v_channels, v_priorities, v_dues, v_updated
        FROM written AS w;
    END IF;

    IF cardinality(v_dues) > 0 AND channels IS NULL AND priorities IS NULL
        AND NOT coalesce(TRUE = ANY(v_stored_leased), FALSE) THEN
        PERFORM "public".dq__wake_if_head(v_queue, v_first_at);  -- plain messages only
    ELSIF cardinality(v_dues) > 0 THEN
        PERFORM "public".dq__offers_written(v_queue, v_channels, v_priorities, v_dues, v_updated, v_now);
    END IF;

    IF v_distinct AND cardinality(v_stored_keys) = 0 THEN
        RETURN QUERY SELECT k.k, 'created'::text FROM unnest(keys) AS k (k);
        RETURN;
    END IF;
    RETURN QUERY
    SELECT c.elem_key::text, c.outcome
    FROM "public".dq__offer_chain(
        keys, payloads, scheduled_ats, channels, priorities, dq_offer_many.headers, can_update, v_now,
        v_stored_keys, v_stored_payloads, v_stored_ats, v_stored_channels, v_stored_priorities,
        v_stored_headers
    ) AS c
    WHERE c.elem_ord > 0
    ORDER BY c.elem_ord;
END
$$;

-- Keyless messages (1.2): dq_send and dq_send_many. A keyless message is
-- never deduplicated: it has key NULL, no entry in the key index, and is
-- addressed by its id (dq_get_id, dq_cancel_id, dq_dead_redrive_id). Sending
-- one is a plain insert at the right edge of the queue's poll index.

-- True when headers is NULL or a JSON object (inlines, for hot paths).
CREATE FUNCTION dq__valid_headers(headers jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT headers IS NULL OR pg_catalog.jsonb_typeof(headers) OPERATOR(pg_catalog.=) 'object' $$;

-- Raise 22023 naming arg_name unless headers is NULL or a JSON object.
CREATE FUNCTION dq__check_headers(headers jsonb, arg_name text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF NOT "public".dq__valid_headers(headers) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format(
                'pgdq: %s must be a JSON object or NULL, got a JSON %s', arg_name, pg_catalog.jsonb_typeof(headers)
            );
    END IF;
END
$$;

-- Raise 22004/22023 unless the dq_send_many arrays are usable: payloads
-- one-dimensional without NULLs, the others NULL or as long as payloads,
-- their elements valid (NULL elements mean the default).
CREATE FUNCTION dq__check_send_arrays(
    payloads jsonb[], scheduled_ats timestamptz[], channels text[], priorities integer[], headers jsonb[]
) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM "public".dq__null_check(payloads IS NULL, 'payloads');
    IF coalesce(array_ndims(payloads), 1) > 1
        OR coalesce(array_ndims(scheduled_ats), 1) > 1
        OR coalesce(array_ndims(channels), 1) > 1
        OR coalesce(array_ndims(priorities), 1) > 1
        OR coalesce(array_ndims(headers), 1) > 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'pgdq: payloads, scheduled_ats, channels, priorities and headers must be one-dimensional arrays';
    END IF;
    IF cardinality(scheduled_ats) <> cardinality(payloads)
        OR cardinality(channels) <> cardinality(payloads)
        OR cardinality(priorities) <> cardinality(payloads)
        OR cardinality(headers) <> cardinality(payloads) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format(
                'pgdq: scheduled_ats, channels, priorities and headers must be NULL or have as many elements as payloads (%s), got %s, %s, %s and %s',
                cardinality(payloads),
                coalesce(cardinality(scheduled_ats)::text, 'NULL'), coalesce(cardinality(channels)::text, 'NULL'),
                coalesce(cardinality(priorities)::text, 'NULL'), coalesce(cardinality(headers)::text, 'NULL')
            );
    END IF;
    PERFORM "public".dq__check_elements(pg_catalog.array_position(payloads, NULL), FALSE, 'payloads');
    PERFORM "public".dq__check_time_elements(scheduled_ats, 'scheduled_ats');
    PERFORM "public".dq__check_channel_elements(channels);
    PERFORM "public".dq__check_headers_elements(headers);
END
$$;

-- Raise 22023 naming the first element of headers that is not a JSON
-- object, by its position (NULL elements pass: none).
CREATE FUNCTION dq__check_headers_elements(headers jsonb[]) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_bad record;
BEGIN
    SELECT h.h, h.ord INTO v_bad
    FROM unnest(headers) WITH ORDINALITY AS h (h, ord)
    WHERE NOT "public".dq__valid_headers(h.h)
    ORDER BY h.ord
    LIMIT 1;
    IF v_bad.ord IS NOT NULL THEN
        PERFORM "public".dq__check_headers(v_bad.h, format('headers[%s]', v_bad.ord));
    END IF;
END
$$;

-- Send one keyless message; its id (docs/sql-reference.md, Keyless messages).
CREATE FUNCTION dq_send(
    queue text,
    payload jsonb,
    scheduled_at timestamptz DEFAULT NULL,
    channel text DEFAULT NULL,
    priority integer DEFAULT 0,
    headers jsonb DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
    v_at timestamptz := coalesce(dq_send.scheduled_at, v_now);
    v_channel text := coalesce(dq_send.channel, '');
    v_priority integer := coalesce(dq_send.priority, 0);
    v_id bigint;
BEGIN
    -- one cheap test on the hot path; the checks say what is wrong
    IF NOT "public".dq__valid_queue(dq_send.queue)
        OR dq_send.payload IS NULL
        OR NOT "public".dq__valid_time(dq_send.scheduled_at)
        OR NOT "public".dq__valid_channel(dq_send.channel)
        OR NOT "public".dq__valid_headers(dq_send.headers) THEN
        PERFORM "public".dq__check_queue(dq_send.queue);
        PERFORM "public".dq__null_check(dq_send.payload IS NULL, 'payload');
        PERFORM "public".dq__check_time(dq_send.scheduled_at, 'scheduled_at');
        PERFORM "public".dq__check_channel(dq_send.channel, 'channel');
        PERFORM "public".dq__check_headers(dq_send.headers, 'headers');
    END IF;
    INSERT INTO "public".dq_messages (
        queue, payload, scheduled_at, due_at, created_at, channel, priority, headers
    )
    VALUES (dq_send.queue, dq_send.payload, v_at, v_at, v_now, v_channel, v_priority, dq_send.headers)
    RETURNING id INTO v_id;
    IF v_channel = '' AND v_priority = 0 THEN
        PERFORM "public".dq__wake_if_head(dq_send.queue, v_at);
    ELSE
        PERFORM "public".dq__offers_written(
            dq_send.queue, ARRAY[v_channel], ARRAY[v_priority], ARRAY[v_at], ARRAY[FALSE], v_now
        );
    END IF;
    RETURN v_id;
END
$$;

-- Send a batch of keyless messages; their ids, in input order.
CREATE FUNCTION dq_send_many(
    queue text,
    payloads jsonb[],
    scheduled_ats timestamptz[] DEFAULT NULL,
    channels text[] DEFAULT NULL,
    priorities integer[] DEFAULT NULL,
    headers jsonb[] DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
BEGIN
    PERFORM "public".dq__check_queue(dq_send_many.queue);
    PERFORM "public".dq__check_send_arrays(payloads, scheduled_ats, channels, priorities, headers);
    IF cardinality(payloads) = 0 THEN
        RETURN;
    END IF;
    -- One insert, its rows in input order (a function scan feeding the
    -- insert, nothing between them that reorders): the identity gives them
    -- ascending ids, returned in that order.
    RETURN QUERY
    INSERT INTO "public".dq_messages AS m (
        queue, payload, scheduled_at, due_at, created_at, channel, priority, headers
    )
    SELECT
        dq_send_many.queue, e.p, coalesce(e.s, v_now), coalesce(e.s, v_now), v_now,
        coalesce(e.c, ''), coalesce(e.pr, 0), e.h
    FROM unnest(payloads, scheduled_ats, channels, priorities, headers) AS e (p, s, c, pr, h)
    RETURNING m.id;
    IF channels IS NULL AND priorities IS NULL THEN
        PERFORM "public".dq__wake_if_head(dq_send_many.queue, CASE
            WHEN scheduled_ats IS NULL THEN v_now
            ELSE (SELECT min(coalesce(s.s, v_now)) FROM unnest(scheduled_ats) AS s (s))
        END);
    ELSE
        PERFORM "public".dq__offers_written(
            dq_send_many.queue, channels, priorities,
            ARRAY(SELECT coalesce(e.s, v_now) FROM unnest(payloads, scheduled_ats) AS e (p, s)),
            NULL::boolean[], v_now
        );
    END IF;
END
$$;

-- Consuming: poll, ack, nack, extend.

-- Lease up to max_count due messages of queue, earliest due first (ties by
-- id); in a queue with channels or priorities, by the turn rule (42_groups.sql).
CREATE FUNCTION dq_poll_many(
    queue text,
    max_count integer,
    lease interval DEFAULT '5 minutes'
) RETURNS SETOF dq_delivery
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
    v_queue text := dq_poll_many.queue;
    v_rows tid[];            -- the picked rows to lease, locked by this poll
    v_max_attempts integer;  -- dq_configure; NULL: no limit
    v_spent bigint[];        -- picked, but already delivered max_attempts times
    v_grouped boolean;       -- the queue has groups (42_groups.sql)
    v_paused boolean;        -- dq_pause
BEGIN
    IF NOT "public".dq__valid_queue(v_queue)
        OR max_count IS NULL
        OR NOT "public".dq__valid_lease(lease, v_now) THEN
        PERFORM "public".dq__check_queue(v_queue);
        PERFORM "public".dq__null_check(max_count IS NULL, 'max_count');
        PERFORM "public".dq__check_lease(lease, v_now);
    END IF;
    IF max_count <= 0 THEN
        RETURN;
    END IF;

    -- the queue's due schedule occurrences become messages first (64_schedules.sql)
    IF EXISTS (SELECT FROM "public".dq_schedules AS s WHERE s.queue = v_queue AND s.next_at <= v_now) THEN
        PERFORM "public".dq__materialise(v_queue, v_now);
    END IF;
    -- one statement: its settings, and whether it has channels or priorities
    SELECT
        q.max_attempts,
        q.paused_at IS NOT NULL,
        EXISTS (SELECT FROM "public".dq_groups AS g WHERE g.queue = v_queue AND g.channel = '')
    INTO v_max_attempts, v_paused, v_grouped
    FROM (SELECT) AS one
    LEFT JOIN "public".dq_queues AS q ON q.queue = v_queue;
    IF v_paused THEN  -- dq_pause (1.2): nothing is leased, nothing buried
        RETURN;
    END IF;
    IF v_grouped THEN
        RETURN QUERY SELECT * FROM "public".dq__poll_grouped(v_queue, max_count, lease, v_now, v_max_attempts);
        RETURN;
    END IF;

    -- Pick and lock in one index range scan of (queue, due_at, id); rows a
    -- concurrent poller holds are skipped, never waited for. The arrays keep
    -- every statement's plan on an index, generic or custom.
    SELECT
        coalesce(array_agg(p.row_at) FILTER (WHERE NOT p.spent), '{}'),
        coalesce(array_agg(p.id) FILTER (WHERE p.spent), '{}')
    INTO v_rows, v_spent
    FROM (
        SELECT m.ctid AS row_at, m.id, coalesce(m.attempts >= v_max_attempts, FALSE) AS spent
        FROM "public".dq_messages AS m
        WHERE m.queue = v_queue AND m.channel = '' AND m.priority = 0 AND m.due_at <= v_now
        ORDER BY m.due_at, m.id
        LIMIT max_count
        FOR UPDATE SKIP LOCKED
    ) AS p;

    -- A due message that already had max_attempts deliveries gets no more:
    -- bury it, saying whether its last lease expired without an ack or nack
    -- (its consumers keep dying) or its last delivery was nacked, and with
    -- which error (dq__gave_up_error).
    IF cardinality(v_spent) > 0 THEN
        PERFORM "public".dq__bury(v_spent, NULL::text, v_now, v_max_attempts);
    END IF;
    IF cardinality(v_rows) = 0 THEN
        RETURN;
    END IF;

    -- The rows stay locked by this transaction, so their addresses (ctid)
    -- still find them: one heap fetch each instead of a primary key lookup.
    RETURN QUERY
    WITH leased AS (
        UPDATE "public".dq_messages AS m
        SET attempts = m.attempts + 1,
            lock_token = "public".dq__token(m.id, (SELECT "public".dq__token_proof())),
            due_at = v_now + lease,
            leased_at = v_now,
            leased_due_at = m.due_at
        FROM unnest(v_rows) WITH ORDINALITY AS picked (row_at, pos)
        WHERE m.ctid = picked.row_at
        RETURNING
            picked.pos,
            m.id, m.queue, m.key, m.payload, m.state, m.scheduled_at,
            m.created_at, m.attempts, m.lock_token, m.due_at, m.headers
    )
    SELECT
        l.id, l.queue::text, l.key::text, l.payload, l.state, l.scheduled_at,
        l.created_at, l.attempts, l.attempts > 1, l.lock_token, l.due_at,
        NULL::text, 0,  -- a plain queue's messages have no channel, priority 0
        l.headers
    FROM leased AS l
    ORDER BY l.pos;
END
$$;

-- Lease the earliest due message of queue, if any.
CREATE FUNCTION dq_poll(
    queue text,
    lease interval DEFAULT '5 minutes'
) RETURNS SETOF dq_delivery
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- plpgsql, not sql: a SQL function that cannot be inlined (its SET
    -- clause) is planned anew on every call, a fifth of an empty poll's time
    RETURN QUERY SELECT * FROM "public".dq_poll_many(dq_poll.queue, 1, dq_poll.lease);
END
$$;

-- Delete the message whose current delivery is lock_token; false when stale.
-- With queue given, a token of another queue's message is stale too (1.2).
CREATE FUNCTION dq_ack(lock_token uuid, queue text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET "dq.outcome" = 'acked'  -- what the history records (57_history.sql)
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
    v_queue text;
    v_channel text;
    v_until timestamptz;
BEGIN
    IF dq_ack.queue IS NOT NULL AND NOT "public".dq__valid_queue(dq_ack.queue) THEN
        PERFORM "public".dq__check_queue(dq_ack.queue);
    END IF;
    DELETE FROM "public".dq_messages AS m
    WHERE m.id = "public".dq__token_id(dq_ack.lock_token)
        AND m.lock_token = dq_ack.lock_token
        AND (dq_ack.queue IS NULL OR m.queue = dq_ack.queue)
    RETURNING m.queue, m.channel, m.due_at INTO v_queue, v_channel, v_until;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    IF v_channel <> '' AND v_until > v_now THEN  -- a channel's slot may be free
        PERFORM "public".dq__leases_ended(ARRAY[v_queue], ARRAY[v_channel], ARRAY[v_until], v_now);
    END IF;
    RETURN TRUE;
END
$$;

-- The channels of queues whose leases a statement ended (for each message:
-- its queue, channel and due time before, ended: its lease was valid at
-- now_at) are told (dq__groups_touch): their slots are free.
CREATE FUNCTION dq__leases_ended(
    queues text[], channels text[], dues timestamptz[], now_at timestamptz
) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_freed record;
BEGIN
    FOR v_freed IN
        SELECT e.q AS queue, array_agg(e.c) AS channels
        FROM unnest(queues, channels, dues) AS e (q, c, d)
        WHERE e.c <> '' AND e.d > now_at
            -- only a channel with max_concurrency has slots to free
            AND EXISTS (
                SELECT FROM "public".dq_groups AS g
                WHERE g.queue = e.q AND g.channel = e.c AND g.max_concurrency IS NOT NULL
            )
        GROUP BY e.q
        ORDER BY e.q
    LOOP
        PERFORM "public".dq__groups_touch(
            v_freed.queue, v_freed.channels,
            array_fill(NULL::timestamptz, ARRAY[cardinality(v_freed.channels)]),
            array_fill(TRUE, ARRAY[cardinality(v_freed.channels)]),
            now_at
        );
    END LOOP;
END
$$;

-- Ack a batch of tokens: the number of messages deleted; stale ones are
-- skipped (with queue given, another queue's too: 1.2).
CREATE FUNCTION dq_ack_many(lock_tokens uuid[], queue text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET "dq.outcome" = 'acked'  -- what the history records (57_history.sql)
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
DECLARE
    v_now timestamptz := "public".dq_now();
    v_rows tid[];
    v_deleted integer;
    v_queues text[];
    v_channels text[];
    v_dues timestamptz[];
BEGIN
    IF dq_ack_many.queue IS NOT NULL AND NOT "public".dq__valid_queue(dq_ack_many.queue) THEN
        PERFORM "public".dq__check_queue(dq_ack_many.queue);
    END IF;
    -- Rows are locked in (queue, key) order, the order dq_offer_many locks
    -- in, so a batch ack and a batch offer never deadlock (keyless messages,
    -- which no offer locks, last, by id).
    v_rows := ARRAY(
        SELECT m.ctid
        FROM "public".dq_messages AS m
        INNER JOIN unnest(lock_tokens) AS t (token)
            ON m.id = "public".dq__token_id(t.token) AND m.lock_token = t.token
        WHERE dq_ack_many.queue IS NULL OR m.queue = dq_ack_many.queue
        ORDER BY m.queue, m.key, m.id
        FOR UPDATE OF m
    );
    -- Locked by this transaction, the rows are still at those addresses
    -- (ctid): one heap fetch each instead of a second primary key lookup.
    -- (A separate statement: its snapshot sees the versions just locked.)
    WITH deleted AS (
        DELETE FROM "public".dq_messages AS m
        WHERE m.ctid = ANY (v_rows)
        RETURNING m.queue, m.channel, m.due_at
    )

    SELECT
        count(*),
        array_agg(d.queue) FILTER (WHERE d.channel <> ''),
        array_agg(d.channel) FILTER (WHERE d.channel <> ''),
        array_agg(d.due_at) FILTER (WHERE d.channel <> '')
    INTO v_deleted, v_queues, v_channels, v_dues
    FROM deleted AS d;
    IF v_queues IS NOT NULL THEN
        PERFORM "public".dq__leases_ended(v_queues, v_channels, v_dues, v_now);
    END IF;
    RETURN v_deleted;
END
$$;

-- Ack lock_tokens (as dq_ack_many), then poll (as dq_poll_many), in one
-- statement: a batch consumer hands back its previous batch with its next
-- poll, one round trip per batch. An addition to version 1 of the SQL API.
CREATE FUNCTION dq_ack_poll(
    lock_tokens uuid[],
    queue text,
    max_count integer,
    lease interval DEFAULT '5 minutes'
) RETURNS SETOF dq_delivery
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM "public".dq_ack_many(lock_tokens);
    -- a bad queue, max_count or lease raises here and undoes the acks
    RETURN QUERY SELECT * FROM "public".dq_poll_many(queue, max_count, lease);
END
$$;

-- Give a leased message back, due at retry_at (NULL: now), with the
-- consumer's error (its last dq__error_max_length() characters; NULL: none)
-- as the message's last_error; false when stale (with queue given, also
-- when the token is another queue's: 1.2).
CREATE FUNCTION dq_nack(
    lock_token uuid,
    retry_at timestamptz DEFAULT NULL,
    state jsonb DEFAULT NULL,
    error text DEFAULT NULL,
    queue text DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
    v_queue text;
    v_due_at timestamptz;
    v_channel text;
    v_priority integer;
BEGIN
    -- a retry time no client could read (infinity parks the message for
    -- ever, -infinity would make dq_next_due report it): refuse it
    IF NOT "public".dq__valid_time(dq_nack.retry_at) THEN
        PERFORM "public".dq__check_time(dq_nack.retry_at, 'retry_at');
    END IF;
    IF dq_nack.queue IS NOT NULL AND NOT "public".dq__valid_queue(dq_nack.queue) THEN
        PERFORM "public".dq__check_queue(dq_nack.queue);
    END IF;
    UPDATE "public".dq_messages AS m
    SET lock_token = NULL,
        due_at = coalesce(dq_nack.retry_at, v_now),
        state = coalesce(dq_nack.state, m.state),
        last_error = right(dq_nack.error, "public".dq__error_max_length())
    WHERE m.id = "public".dq__token_id(dq_nack.lock_token)
        AND m.lock_token = dq_nack.lock_token
        AND (dq_nack.queue IS NULL OR m.queue = dq_nack.queue)
    RETURNING m.queue, m.due_at, m.channel, m.priority INTO v_queue, v_due_at, v_channel, v_priority;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    IF v_channel = '' AND v_priority = 0 THEN
        -- a message handed back before the queue's head wakes idle consumers
        PERFORM "public".dq__wake_if_head(v_queue, v_due_at);
        RETURN TRUE;
    END IF;
    -- its lease may have been valid: a slot of its channel may be free
    IF v_channel <> '' THEN
        PERFORM "public".dq__groups_touch(v_queue, ARRAY[v_channel], ARRAY[v_due_at], '{TRUE}', v_now);
    END IF;
    PERFORM "public".dq__wake_if_first(v_queue, v_due_at, v_now);
    RETURN TRUE;
END
$$;

-- Heartbeat: lease until now + lease; the new lease_until, NULL when stale
-- (with queue given, also when the token is another queue's: 1.2).
-- A lease that has ended comes back only while its channel has a free slot.
CREATE FUNCTION dq_extend(
    lock_token uuid,
    lease interval,
    queue text DEFAULT NULL
) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
    v_until timestamptz;
    v_message record;
    v_max integer;
BEGIN
    IF NOT "public".dq__valid_lease(lease, v_now) THEN
        PERFORM "public".dq__check_lease(lease, v_now);
    END IF;
    IF dq_extend.queue IS NOT NULL AND NOT "public".dq__valid_queue(dq_extend.queue) THEN
        PERFORM "public".dq__check_queue(dq_extend.queue);
    END IF;
    UPDATE "public".dq_messages AS m
    SET due_at = v_now + lease
    WHERE m.id = "public".dq__token_id(dq_extend.lock_token)
        AND m.lock_token = dq_extend.lock_token
        AND (dq_extend.queue IS NULL OR m.queue = dq_extend.queue)
        AND m.channel = ''
    RETURNING m.due_at INTO v_until;
    IF FOUND THEN
        RETURN v_until;
    END IF;

    -- A channel's message: a poll counting its slots must not see a lease
    -- come back after it counted it as ended. Under the channel's row, which
    -- polls hold while they count, with the clock read afresh.
    SELECT m.queue, m.channel INTO v_message
    FROM "public".dq_messages AS m
    WHERE m.id = "public".dq__token_id(dq_extend.lock_token)
        AND m.lock_token = dq_extend.lock_token
        AND (dq_extend.queue IS NULL OR m.queue = dq_extend.queue);
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_max := (
        SELECT g.max_concurrency FROM "public".dq_groups AS g
        WHERE g.queue = v_message.queue AND g.channel = v_message.channel
    );
    IF v_max IS NOT NULL THEN
        SELECT g.max_concurrency INTO v_max
        FROM "public".dq_groups AS g
        WHERE g.queue = v_message.queue AND g.channel = v_message.channel
        FOR NO KEY UPDATE;
        v_now := "public".dq_now();
    END IF;
    UPDATE "public".dq_messages AS m
    SET due_at = v_now + lease
    WHERE m.id = "public".dq__token_id(dq_extend.lock_token)
        AND m.lock_token = dq_extend.lock_token
        AND m.queue = v_message.queue
        AND (
            v_max IS NULL OR m.due_at > v_now
            OR (SELECT h.held FROM "public".dq__leases_held(m.queue, m.channel, v_now, v_max) AS h) < v_max
        )
    RETURNING m.due_at INTO v_until;
    RETURN v_until;
END
$$;

-- Channels and priority (since 1.1): how a poll shares a queue between its
-- groups and holds each channel to its limits (docs/channels.md).
--
-- A queue whose messages all have no channel and priority 0 is plain: it has
-- no row in dq_groups and its polls take the 1.0 path (40_consume.sql). The
-- first message with a channel or a priority gives the queue its rows: one
-- per channel and one ('') for its unchanneled group.
--
-- The turn rule: each message a poll takes comes from the group whose most
-- recent lease is the oldest (dq_groups.turn, NULL: never) among the groups
-- with an eligible message; ties (groups never leased from) go to the one
-- whose next message is due earliest, then the unchanneled group, then by
-- name. Within a group: priority, then due time, then id.
--
-- Limits are exact and cannot drift: a channel's leases are counted from
-- the messages themselves (dq_messages_leases), an expired lease holds no
-- slot, and a poll takes messages of a group only while it holds the
-- group's row (FOR NO KEY UPDATE): two polls never count the same slots.
--
-- Polls look only at the groups whose wake_at is NULL; a group found with
-- nothing eligible gets the earliest time it could have something (wake_at)
-- and is skipped until then. Every write that can make a group eligible
-- sooner (an offer, a nack, a freed slot) lowers wake_at again. So that such
-- a write is never lost to a poll that is just putting the group to sleep,
-- writers hold the group's row FOR KEY SHARE while they look at it, and a
-- poll puts a group to sleep only under FOR UPDATE (which conflicts with it),
-- reading the messages after taking that lock. Lock order: messages before
-- groups, groups by channel; polls never wait (SKIP LOCKED).
--
-- No JIT (SET jit = off): with the planner's generic estimates for these
-- statements (a recursive CTE over an unknown number of priority levels),
-- a poll of a queue of a million messages looked costly enough to compile
-- its statements on every call, and took 0.3-0.5 s instead of a millisecond.

-- "Never", for dq_groups' times: the last instant a Python datetime (and
-- most clients) can read, where 'infinity' cannot be. A lower bound there
-- stays one: nothing is due before it that it could hide.
CREATE FUNCTION dq__never() RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '9999-12-31 23:59:59+00'::pg_catalog.timestamptz $$;

-- dq__levels' step to level 0 of the unchanneled group (in dq_messages_due,
-- not in the index the other levels are read from): taken when the group
-- is the unchanneled one, level 0 is allowed (still ahead) and next_level,
-- the next level in the other index, is below 0 or none;
-- plain_due is the earliest due time in it then.
CREATE FUNCTION dq__level_zero(queue text, channel text, allowed boolean, next_level integer)
RETURNS TABLE (zero boolean, plain_due timestamptz)
LANGUAGE sql STABLE
AS $$
    SELECT
        z.zero,
        CASE WHEN z.zero THEN (
            SELECT m.due_at FROM "public".dq_messages AS m
            WHERE m.queue OPERATOR(pg_catalog.=) dq__level_zero.queue
                AND m.channel OPERATOR(pg_catalog.=) '' AND m.priority OPERATOR(pg_catalog.=) 0
            ORDER BY m.due_at, m.id
            LIMIT 1
        ) END
    FROM (
        SELECT dq__level_zero.channel OPERATOR(pg_catalog.=) '' AND allowed
            AND coalesce(next_level OPERATOR(pg_catalog.<) 0, TRUE) AS zero
    ) AS z
$$;

-- The priority levels of a group's messages from at_most down (NULL: all),
-- highest first, each with the earliest due time in it (a leased message
-- by its lease's end): one index probe a level, which finds both. For the
-- unchanneled group level 0 too, whose messages are in dq_messages_due.
-- Inlined into its callers (a plain SQL function), so a caller that stops
-- early reads no more levels.
CREATE FUNCTION dq__levels(queue text, channel text, at_most integer)
RETURNS TABLE (priority integer, first_due timestamptz)
LANGUAGE sql STABLE
AS $$
    WITH RECURSIVE levels AS (
        SELECT
            CASE WHEN z.zero THEN 0 ELSE g.priority END AS p,
            CASE WHEN z.zero THEN z.plain_due ELSE g.due_at END AS d
        FROM (SELECT) AS start
        LEFT JOIN LATERAL (
            SELECT m.priority, m.due_at FROM "public".dq_messages AS m
            WHERE m.queue OPERATOR(pg_catalog.=) dq__levels.queue
                AND m.channel OPERATOR(pg_catalog.=) dq__levels.channel
                AND (m.channel OPERATOR(pg_catalog.<>) '' OR m.priority OPERATOR(pg_catalog.<>) 0)
                AND m.priority OPERATOR(pg_catalog.<=) coalesce(at_most, 2147483647)
            ORDER BY m.priority DESC, m.due_at, m.id
            LIMIT 1
        ) AS g ON TRUE
        CROSS JOIN LATERAL "public".dq__level_zero(
            dq__levels.queue, dq__levels.channel, coalesce(at_most, 0) OPERATOR(pg_catalog.>=) 0, g.priority
        ) AS z
        UNION ALL
        SELECT
            CASE WHEN z.zero THEN 0 ELSE g.priority END,
            CASE WHEN z.zero THEN z.plain_due ELSE g.due_at END
        FROM levels AS l
        LEFT JOIN LATERAL (
            SELECT m.priority, m.due_at FROM "public".dq_messages AS m
            WHERE m.queue OPERATOR(pg_catalog.=) dq__levels.queue
                AND m.channel OPERATOR(pg_catalog.=) dq__levels.channel
                AND (m.channel OPERATOR(pg_catalog.<>) '' OR m.priority OPERATOR(pg_catalog.<>) 0)
                AND m.priority OPERATOR(pg_catalog.<) l.p
            ORDER BY m.priority DESC, m.due_at, m.id
            LIMIT 1
        ) AS g ON TRUE
        CROSS JOIN LATERAL "public".dq__level_zero(
            dq__levels.queue, dq__levels.channel, l.p OPERATOR(pg_catalog.>) 0, g.priority
        ) AS z
        WHERE l.p IS NOT NULL
    )

    SELECT l.p, l.d FROM levels AS l WHERE l.p IS NOT NULL
$$;


-- Up to wants[i] due messages of group channels[i] of queue ('' the
-- unchanneled group) in delivery order (priority, due time, id) after the
-- position (after_priorities[i], after_dues[i], after_ids[i]; a NULL
-- priority: from the start), locked, rows that others hold skipped; pos is
-- i; spent: already delivered max_attempts times. One statement for all the
-- groups, one index probe per priority level a group reaches (dq__levels):
-- a group's future messages are never read.
CREATE FUNCTION dq__heads(
    queue text,
    channels text[],
    wants integer[],
    after_priorities integer[],
    after_dues timestamptz[],
    after_ids bigint[],
    now_at timestamptz,
    max_attempts integer
) RETURNS TABLE (pos integer, row_at tid, id bigint, priority integer, due_at timestamptz, spent boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off  -- the header
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT t.pos::integer, h.row_at, h.id, h.priority, h.due_at, coalesce(h.attempts >= max_attempts, FALSE)
    FROM unnest(channels, wants, after_priorities, after_dues, after_ids)
        WITH ORDINALITY AS t (c, want, ap, ad, ai, pos)
    CROSS JOIN LATERAL (
        SELECT
            coalesce(hp.row_at, hg.row_at) AS row_at,
            coalesce(hp.id, hg.id) AS id,
            coalesce(hp.priority, hg.priority) AS priority,
            coalesce(hp.due_at, hg.due_at) AS due_at,
            coalesce(hp.attempts, hg.attempts) AS attempts
        FROM "public".dq__levels(dq__heads.queue, t.c, t.ap) AS l (p, d)
        LEFT JOIN LATERAL (
            SELECT m.ctid AS row_at, m.id, m.priority, m.due_at, m.attempts
            FROM "public".dq_messages AS m
            WHERE t.c = '' AND l.p = 0 AND l.d <= now_at
                AND m.queue = dq__heads.queue AND m.channel = '' AND m.priority = 0
                AND m.due_at <= now_at
                AND (m.due_at, m.id) > (
                    CASE WHEN t.ap = 0 THEN t.ad ELSE '-infinity' END, CASE WHEN t.ap = 0 THEN t.ai ELSE 0 END
                )
            ORDER BY m.due_at, m.id
            LIMIT t.want
            FOR UPDATE SKIP LOCKED
        ) AS hp ON TRUE
        LEFT JOIN LATERAL (
            SELECT m.ctid AS row_at, m.id, m.priority, m.due_at, m.attempts
            FROM "public".dq_messages AS m
            WHERE NOT (t.c = '' AND l.p = 0) AND l.d <= now_at
                AND m.queue = dq__heads.queue AND m.channel = t.c AND m.priority = l.p
                AND (m.channel <> '' OR m.priority <> 0)
                AND m.due_at <= now_at
                AND (m.due_at, m.id) > (
                    CASE WHEN t.ap = l.p THEN t.ad ELSE '-infinity' END, CASE WHEN t.ap = l.p THEN t.ai ELSE 0 END
                )
            ORDER BY m.due_at, m.id
            LIMIT t.want
            FOR UPDATE SKIP LOCKED
        ) AS hg ON TRUE
        WHERE coalesce(hp.id, hg.id) IS NOT NULL
        LIMIT t.want
    ) AS h
    ORDER BY t.pos, h.priority DESC, h.due_at, h.id;
END
$$;

-- The first deliverable message of a group in delivery order, locked (NULL
-- fields: none); the spent ones before it (attempts >= max_attempts) are
-- buried on the way.
CREATE FUNCTION dq__group_first(
    queue text,
    channel text,
    now_at timestamptz,
    max_attempts integer,
    OUT row_at tid,
    OUT id bigint,
    OUT priority integer,
    OUT due_at timestamptz
)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off  -- the header
AS $$
#variable_conflict use_column
DECLARE
    v_spent boolean := TRUE;
BEGIN
    WHILE v_spent LOOP
        SELECT h.row_at, h.id, h.priority, h.due_at, h.spent
        INTO row_at, id, priority, due_at, v_spent
        FROM "public".dq__heads(
            queue, ARRAY[channel], '{1}', ARRAY[priority], ARRAY[due_at], ARRAY[id], now_at, max_attempts
        ) AS h;
        IF v_spent THEN
            PERFORM "public".dq__bury(ARRAY[id], NULL::text, now_at, max_attempts);
        END IF;
    END LOOP;
END
$$;

-- The earliest due time of a group's messages (leased ones by their
-- lease's end); NULL when it has none. One probe per priority level.
CREATE FUNCTION dq__group_first_due(queue text, channel text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off  -- the header
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN (
        SELECT min(l.first_due)
        FROM "public".dq__levels(dq__group_first_due.queue, dq__group_first_due.channel, NULL) AS l
    );
END
$$;

-- How many of a channel's leases are valid at now_at, counting up to limit.
-- A table of one row, called as (SELECT h.held FROM dq__leases_held(...) AS h):
-- so PostgreSQL inlines it into the caller's statement. A scalar SQL
-- function with a FROM is never inlined; it was planned anew in every
-- statement that called it, 50-100 microseconds a poll or ack (1.2).
CREATE FUNCTION dq__leases_held(queue text, channel text, now_at timestamptz, limit_count integer)
RETURNS TABLE (held integer)
LANGUAGE sql STABLE
AS $$
    SELECT pg_catalog.count(*)::pg_catalog.int4 FROM (
        SELECT FROM "public".dq_messages AS m
        WHERE m.queue OPERATOR(pg_catalog.=) dq__leases_held.queue
            AND m.channel OPERATOR(pg_catalog.=) dq__leases_held.channel
            AND m.lock_token IS NOT NULL AND m.channel OPERATOR(pg_catalog.<>) ''
            AND m.due_at OPERATOR(pg_catalog.>) now_at
        LIMIT limit_count
    ) AS held
$$;

-- The earliest time at which a message of the group could be eligible, as
-- seen at now_at: its first due time, no earlier than the end of its
-- min_interval and, while its max_concurrency slots are all held, than the
-- first of those leases to end. NULL when it has no message.
CREATE FUNCTION dq__group_next_eligible(
    queue text,
    channel text,
    max_concurrency integer,
    min_interval interval,
    last_leased_at timestamptz,
    now_at timestamptz
) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off  -- the header
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_at timestamptz := "public".dq__group_first_due(queue, channel);
BEGIN
    IF v_at IS NULL THEN
        RETURN NULL;
    END IF;
    v_at := greatest(v_at, last_leased_at + min_interval);
    IF max_concurrency IS NOT NULL
        AND (SELECT h.held FROM "public".dq__leases_held(queue, channel, now_at, max_concurrency) AS h)
            >= max_concurrency THEN
        v_at := greatest(v_at, (
            SELECT m.due_at FROM "public".dq_messages AS m
            WHERE m.queue = dq__group_next_eligible.queue AND m.channel = dq__group_next_eligible.channel
                AND m.lock_token IS NOT NULL AND m.channel <> ''
                AND m.due_at > now_at
            ORDER BY m.due_at
            LIMIT 1
        ));
    END IF;
    RETURN v_at;
END
$$;

-- A poll found nothing eligible in this group (held by the poll): unless a
-- writer holds it, put it to sleep until it could have something, or forget
-- it when it has no message and no limits. Reads the messages only after
-- locking the row against writers (the header).
CREATE FUNCTION dq__group_rest(queue text, channel text, now_at timestamptz) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off  -- the header
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_group record;
    v_next timestamptz;
BEGIN
    SELECT g.max_concurrency, g.min_interval, g.last_leased_at INTO v_group
    FROM "public".dq_groups AS g
    WHERE g.queue = dq__group_rest.queue AND g.channel = dq__group_rest.channel
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;  -- a writer is at it: it stays awake
    END IF;
    v_next := "public".dq__group_next_eligible(
        queue, channel, v_group.max_concurrency, v_group.min_interval, v_group.last_leased_at, now_at
    );
    IF v_next IS NULL AND v_group.max_concurrency IS NULL AND v_group.min_interval IS NULL THEN
        DELETE FROM "public".dq_groups AS g
        WHERE g.queue = dq__group_rest.queue AND g.channel = dq__group_rest.channel;
    ELSIF coalesce(v_next > now_at, TRUE) THEN
        UPDATE "public".dq_groups AS g
        SET wake_at = coalesce(v_next, "public".dq__never()),
            first_due = coalesce("public".dq__group_first_due(queue, channel), g.first_due)
        WHERE g.queue = dq__group_rest.queue AND g.channel = dq__group_rest.channel;
    END IF;
END
$$;

-- Writers: messages due at dues[i] (NULL: none) were written into
-- channels[i] ('' for none) of queue, and freed[i] says a lease of that
-- channel may have ended. Creates the groups that are new and wakes every
-- group that could now have an eligible message sooner than it was told
-- (the header); notifies dq_wakeup when a freed slot lets a held-back
-- message go. Call after writing the messages (lock order).
CREATE FUNCTION dq__groups_touch(
    queue text,
    channels text[],
    dues timestamptz[],
    freed boolean[],
    now_at timestamptz
) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off  -- the header
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_queue text := dq__groups_touch.queue;
    v_channels text[];       -- the channels touched, by name ('' excluded)
    v_dues timestamptz[];    -- the earliest due time written into each
    v_freed integer[];       -- how many of its leases may have ended
    v_locked text[];         -- the channels shared
    v_full text[];           -- channels whose freed slot lets a due message go
BEGIN
    SELECT
        coalesce(array_agg(t.c ORDER BY t.c) FILTER (WHERE t.c <> ''), '{}'),
        array_agg(t.d ORDER BY t.c) FILTER (WHERE t.c <> ''),
        array_agg(t.f ORDER BY t.c) FILTER (WHERE t.c <> '')
    INTO v_channels, v_dues, v_freed
    FROM (
        SELECT e.c COLLATE "C" AS c, min(e.d) AS d, count(*) FILTER (WHERE e.f)::integer AS f
        FROM unnest(channels, dues, freed) AS e (c, d, f)
        GROUP BY e.c COLLATE "C"
    ) AS t;

    -- The rows, new ones first ('' marks the queue as grouped), then a share
    -- of each against a poll putting it to sleep. A poll may delete an empty
    -- group between the two statements: then create it again.
    LOOP
        INSERT INTO "public".dq_groups AS g (queue, channel, first_due, wake_at)
        SELECT v_queue, n.c, coalesce(n.d, now_at), CASE WHEN n.d > now_at THEN n.d END
        FROM (
            SELECT '' AS c, now_at AS d
            UNION ALL
            SELECT t.c, t.d FROM unnest(v_channels, v_dues) AS t (c, d) WHERE t.d IS NOT NULL
        ) AS n
        ORDER BY n.c COLLATE "C"
        ON CONFLICT ON CONSTRAINT dq_groups_pkey DO NOTHING;
        v_locked := ARRAY(
            SELECT g.channel FROM "public".dq_groups AS g
            WHERE g.queue = v_queue AND g.channel = ANY(v_channels)
            ORDER BY g.channel
            FOR KEY SHARE
        );
        EXIT WHEN NOT EXISTS (
            SELECT FROM unnest(v_channels, v_dues) AS t (c, d)
            WHERE t.d IS NOT NULL AND t.c <> ALL(v_locked)
        );
    END LOOP;

    -- Wake the groups told to sleep past what was written (or, for a freed
    -- slot of a channel with max_concurrency, past now), and keep the due
    -- time that orders groups never leased from a lower bound.
    WITH woken AS (
        SELECT g.channel, t.d,
            least(t.d, CASE WHEN t.f > 0 AND g.max_concurrency IS NOT NULL THEN now_at END) AS low
        FROM "public".dq_groups AS g
        INNER JOIN unnest(v_channels, v_dues, v_freed) AS t (c, d, f) ON g.channel = t.c
        WHERE g.queue = v_queue
            AND (
                g.wake_at > least(t.d, CASE WHEN t.f > 0 AND g.max_concurrency IS NOT NULL THEN now_at END)
                OR (g.turn IS NULL AND g.first_due > t.d)
            )
        ORDER BY g.channel
        FOR NO KEY UPDATE OF g
    )

    UPDATE "public".dq_groups AS g
    SET wake_at = CASE
            WHEN g.wake_at IS NULL OR woken.low IS NULL OR g.wake_at <= woken.low THEN g.wake_at
            WHEN woken.low <= now_at THEN NULL
            ELSE woken.low
        END,
        first_due = CASE WHEN g.turn IS NULL THEN least(g.first_due, woken.d) ELSE g.first_due END
    FROM woken
    WHERE g.queue = v_queue AND g.channel = woken.channel;

    -- A consumer sleeping until dq_next_due may be waiting out the lease
    -- whose slot was just freed: wake it if a message of that channel is due.
    v_full := ARRAY(
        SELECT g.channel FROM "public".dq_groups AS g
        INNER JOIN unnest(v_channels, v_freed) AS t (c, f) ON g.channel = t.c
        WHERE g.queue = v_queue AND t.f > 0 AND g.max_concurrency IS NOT NULL
            AND (SELECT h.held FROM "public".dq__leases_held(v_queue, g.channel, now_at, g.max_concurrency) AS h)
                + t.f
                >= g.max_concurrency
            -- dq__group_first_due, inlined: a call per channel cost its
            -- settings' save and restore, more than its probes
            AND (SELECT min(l.first_due) FROM "public".dq__levels(v_queue, g.channel, NULL) AS l) <= now_at
    );
    IF cardinality(v_full) > 0 THEN
        PERFORM "public".dq__wake(v_queue);
    END IF;
END
$$;

-- True when the unchanneled group (turn, next message due at due) comes
-- before a group of the turn order (its turn and first_due, a lower bound
-- of its next message's due time) by the turn rule.
CREATE FUNCTION dq__unchanneled_first(
    turn bigint, due timestamptz, other_turn bigint, other_first_due timestamptz
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN turn IS NULL THEN other_turn IS NOT NULL OR due OPERATOR(pg_catalog.<=) other_first_due
        WHEN other_turn IS NULL THEN FALSE
        ELSE turn OPERATOR(pg_catalog.<) other_turn
    END
$$;

-- How many more messages of a channel a poll at now_at may lease, given
-- those it already holds (held); NULL: no limit.
CREATE FUNCTION dq__group_room(
    max_concurrency integer,
    min_interval interval,
    last_leased_at timestamptz,
    held integer,
    now_at timestamptz
) RETURNS integer
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT LEAST(
        CASE
            WHEN min_interval IS NULL THEN NULL
            WHEN last_leased_at OPERATOR(pg_catalog.>) (now_at OPERATOR(pg_catalog.-) min_interval) THEN 0
            ELSE 1
        END,
        max_concurrency OPERATOR(pg_catalog.-) held
    )
$$;

-- Lease up to max_count messages of a grouped queue by the turn rule (the
-- header), each until now_at + lease; due messages already delivered
-- max_attempts times are buried instead. The first round takes one message
-- from each group in turn order, a batch of groups at a time; later rounds
-- go round the groups taken from, in the same order, as the rule makes them
-- come round again. A batch or a round is a few statements, whatever its size.
CREATE FUNCTION dq__poll_grouped(
    queue text,
    max_count integer,
    lease interval,
    now_at timestamptz,
    max_attempts integer
) RETURNS SETOF dq_delivery
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off  -- the header
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_queue text := dq__poll_grouped.queue;
    v_plain_turn bigint;     -- the unchanneled group's turn, when this poll holds it
    v_plain record;          -- and its next message (row_at, id, priority, due_at)
    v_plain_unread boolean;  -- held, its next message not read yet
    v_plain_waiting boolean; -- read, still to take its turn in the first round
    -- a batch of the turn order (locked): its groups, their room, their heads
    v_want integer;
    v_n integer;
    v_restart boolean;
    v_batch "public".dq_groups[];
    v_h record;              -- their rooms and heads: arrays by position in the batch
    v_head record;
    v_take text;             -- the group whose message v_head is taken (NULL: none)
    v_room integer;          -- and the room it has left
    v_visited text[] := '{}';
    -- the messages taken: where, which, from which group, in which round
    v_rows tid[] := '{}';
    v_ids bigint[] := '{}';
    v_groups text[] := '{}';
    v_rounds integer[] := '{}';
    v_spent bigint[] := '{}';
    -- the groups taken from, in first-round order: room left, position reached
    v_taken_from text[] := '{}';
    v_room_left integer[] := '{}';
    v_after_priority integer[] := '{}';
    v_after_due timestamptz[] := '{}';
    v_after_id bigint[] := '{}';
    v_round integer[];
    v_wants integer[];
    v_got integer[];
    v_read integer[];
    v_left integer;
    v_each integer;
    v_turns regclass;        -- dq_turns
    v_turned text[];         -- the groups taken from, in the order of their last message
    v_turn_values bigint[];
    i integer;
BEGIN
    -- groups whose wake time has come are looked at again
    UPDATE "public".dq_groups AS g
    SET wake_at = NULL
    WHERE g.ctid = ANY(ARRAY(
        SELECT w.ctid FROM "public".dq_groups AS w
        WHERE w.queue = v_queue AND w.wake_at <= now_at
        ORDER BY w.wake_at
        FOR NO KEY UPDATE SKIP LOCKED
    ));

    -- the unchanneled group has no row in the turn order's index scan: its
    -- messages never put it to sleep, so its next one is read every time
    SELECT g.turn INTO v_plain_turn
    FROM "public".dq_groups AS g
    WHERE g.queue = v_queue AND g.channel = ''
    FOR NO KEY UPDATE SKIP LOCKED;
    v_plain_unread := FOUND;  -- its next message comes with the first batch's
    v_plain_waiting := FALSE;
    SELECT NULL::tid AS row_at, NULL::bigint AS id, NULL::integer AS priority, NULL::timestamptz AS due_at
    INTO v_plain;

    -- The first round, a batch of the turn order at a time.
    LOOP
        v_want := max_count - cardinality(v_ids);
        EXIT WHEN v_want <= 0;
        v_batch := ARRAY(
            SELECT g FROM "public".dq_groups AS g
            WHERE g.queue = v_queue AND g.wake_at IS NULL AND g.channel <> ''
                AND g.channel <> ALL(v_visited)
            ORDER BY g.turn NULLS FIRST, g.first_due, g.channel
            LIMIT v_want
            FOR NO KEY UPDATE SKIP LOCKED
        );
        v_n := cardinality(v_batch);
        -- Each group's room (counted now that the rows are locked: this
        -- statement's snapshot sees every lease committed before the locks)
        -- and its next message if it has room; the unchanneled group's next
        -- message comes last, with the first batch.
        WITH rooms AS (
            SELECT b.ordinality AS o, b.channel, "public".dq__group_room(
                b.max_concurrency, b.min_interval, b.last_leased_at,
                CASE WHEN b.max_concurrency IS NOT NULL THEN
                    (SELECT h.held FROM "public".dq__leases_held(v_queue, b.channel, now_at, b.max_concurrency) AS h)
                END,
                now_at
            ) AS room
            FROM unnest(v_batch) WITH ORDINALITY AS b
        )

        SELECT (SELECT array_agg(r.room ORDER BY r.o) FROM rooms AS r) AS room,
            array_agg(h.row_at ORDER BY b.o) AS row_at, array_agg(h.id ORDER BY b.o) AS id,
            array_agg(h.priority ORDER BY b.o) AS priority, array_agg(h.due_at ORDER BY b.o) AS due_at,
            array_agg(h.spent ORDER BY b.o) AS spent
        INTO v_h
        FROM generate_series(1, v_n + 1) AS b (o)
        LEFT JOIN "public".dq__heads(
            v_queue,
            ARRAY(SELECT r.channel FROM rooms AS r ORDER BY r.o) || ''::text,
            ARRAY(SELECT (coalesce(r.room > 0, TRUE))::integer FROM rooms AS r ORDER BY r.o) || v_plain_unread::integer,
            '{}', '{}', '{}',  -- from the start (unnest pads them with NULLs)
            now_at, max_attempts
        ) AS h ON h.pos = b.o;
        IF v_plain_unread THEN
            SELECT v_h.row_at[v_n + 1] AS row_at, v_h.id[v_n + 1] AS id, v_h.priority[v_n + 1] AS priority,
                v_h.due_at[v_n + 1] AS due_at
            INTO v_plain;
            IF v_h.spent[v_n + 1] THEN  -- already delivered max_attempts times: bury, take the next
                v_plain := "public".dq__group_first(v_queue, '', now_at, max_attempts);
            END IF;
            v_plain_waiting := v_plain.id IS NOT NULL;
            v_plain_unread := FALSE;
        END IF;

        -- Take the batch's heads in turn order; the unchanneled group takes
        -- its place among them, or after the last group of the turn order.
        v_restart := FALSE;
        i := 1;
        WHILE cardinality(v_ids) < max_count LOOP
            v_take := NULL;
            IF v_plain_waiting AND (CASE
                WHEN i > v_n THEN v_n < v_want
                ELSE "public".dq__unchanneled_first(
                    v_plain_turn, v_plain.due_at, (v_batch[i]).turn, (v_batch[i]).first_due
                )
            END) THEN
                v_head := v_plain;
                v_take := '';
                v_room := NULL;
                v_plain_waiting := FALSE;
            ELSE
                EXIT WHEN i > v_n;
                IF v_h.spent[i] THEN  -- already delivered max_attempts times: bury, take the next
                    v_head := "public".dq__group_first(v_queue, (v_batch[i]).channel, now_at, max_attempts);
                ELSE
                    SELECT v_h.row_at[i] AS row_at, v_h.id[i] AS id, v_h.priority[i] AS priority,
                        v_h.due_at[i] AS due_at
                    INTO v_head;
                END IF;
                IF v_head.id IS NULL THEN
                    -- nothing eligible: it sleeps until it could have something
                    PERFORM "public".dq__group_rest(v_queue, (v_batch[i]).channel, now_at);
                ELSIF (v_batch[i]).turn IS NULL AND v_head.due_at > (v_batch[i]).first_due THEN
                    -- never leased from, and placed too early (its earliest message
                    -- went): place it right and read the turn order again
                    UPDATE "public".dq_groups AS g
                    SET first_due = v_head.due_at
                    WHERE g.queue = v_queue AND g.channel = (v_batch[i]).channel;
                    v_restart := TRUE;
                    EXIT;
                ELSE
                    v_take := (v_batch[i]).channel;
                    v_room := v_h.room[i] - 1;
                END IF;
                v_visited := v_visited || (v_batch[i]).channel;
                i := i + 1;
            END IF;
            IF v_take IS NOT NULL THEN
                v_rows := v_rows || v_head.row_at;
                v_ids := v_ids || v_head.id;
                v_groups := v_groups || v_take;
                v_taken_from := v_taken_from || v_take;
                v_room_left := v_room_left || v_room;
                v_after_priority := v_after_priority || v_head.priority;
                v_after_due := v_after_due || v_head.due_at;
                v_after_id := v_after_id || v_head.id;
            END IF;
        END LOOP;
        EXIT WHEN NOT v_restart AND v_n < v_want;
    END LOOP;
    v_rounds := array_fill(1, ARRAY[cardinality(v_ids)]);

    -- Later rounds: the groups taken from come round again in the same
    -- order. Each pass asks every group with room for an equal share of
    -- what is left, all in one statement; a group that gives less is done.
    v_round := array_fill(1, ARRAY[cardinality(v_taken_from)]);
    v_wants := array_fill(1, ARRAY[cardinality(v_taken_from)]);
    LOOP
        v_left := max_count - cardinality(v_ids);
        EXIT WHEN v_left <= 0 OR NOT 0 < ANY(v_wants);
        v_each := ceil(v_left::numeric / (SELECT count(*) FROM unnest(v_wants) AS w (w) WHERE w.w > 0));
        v_wants := ARRAY(
            SELECT CASE WHEN w.w > 0 THEN least(v_each, coalesce(w.room, v_each)) ELSE 0 END
            FROM unnest(v_wants, v_room_left) WITH ORDINALITY AS w (w, room, o)
            ORDER BY w.o
        );
        v_got := array_fill(0, ARRAY[cardinality(v_taken_from)]);
        v_read := array_fill(0, ARRAY[cardinality(v_taken_from)]);
        FOR v_head IN
            SELECT * FROM "public".dq__heads(
                v_queue, v_taken_from, v_wants, v_after_priority, v_after_due, v_after_id, now_at, max_attempts
            )
        LOOP
            i := v_head.pos;
            v_read[i] := v_read[i] + 1;
            v_after_priority[i] := v_head.priority;
            v_after_due[i] := v_head.due_at;
            v_after_id[i] := v_head.id;
            IF v_head.spent THEN
                v_spent := v_spent || v_head.id;
                CONTINUE;
            END IF;
            v_got[i] := v_got[i] + 1;
            v_round[i] := v_round[i] + 1;
            v_rows := v_rows || v_head.row_at;
            v_ids := v_ids || v_head.id;
            v_groups := v_groups || v_taken_from[i];
            v_rounds := v_rounds || v_round[i];
        END LOOP;
        -- a group that gave all it was asked for may have more
        v_wants := ARRAY(
            SELECT CASE WHEN w.w > 0 AND w.r = w.w AND coalesce(w.room - w.g > 0, TRUE) THEN 1 ELSE 0 END
            FROM unnest(v_wants, v_read, v_got, v_room_left) WITH ORDINALITY AS w (w, r, g, room, o)
            ORDER BY w.o
        );
        v_room_left := ARRAY(
            SELECT w.room - w.g FROM unnest(v_room_left, v_got) WITH ORDINALITY AS w (room, g, o) ORDER BY w.o
        );
    END LOOP;

    IF cardinality(v_spent) > 0 THEN
        PERFORM "public".dq__bury(v_spent, NULL::text, now_at, max_attempts);
    END IF;
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;

    -- The order of delivery: by round, then first-round order; at most
    -- max_count (the last pass may have locked a few more: they stay due).
    SELECT array_agg(t.row_at ORDER BY t.ord), array_agg(t.grp ORDER BY t.ord)
    INTO v_rows, v_groups
    FROM (
        SELECT o.row_at, o.grp, o.ord
        FROM (
            SELECT e.row_at, e.grp,
                row_number() OVER (ORDER BY e.rnd, array_position(v_taken_from, e.grp)) AS ord
            FROM unnest(v_rows, v_groups, v_rounds) AS e (row_at, grp, rnd)
        ) AS o
        WHERE o.ord <= max_count
    ) AS t;

    -- Each group taken from becomes the most recent in the order of its
    -- last message here; one with a min_interval sleeps it out.
    v_turned := ARRAY(
        SELECT e.grp FROM unnest(v_groups) WITH ORDINALITY AS e (grp, ord)
        GROUP BY e.grp
        ORDER BY max(e.ord)
    );
    v_turns := (SELECT sq.tableoid FROM "public".dq_turns AS sq);
    -- ascending, one per group, in that order (generate_series gives them in order)
    v_turn_values := ARRAY(SELECT pg_catalog.nextval(v_turns) FROM generate_series(1, cardinality(v_turned)));
    UPDATE "public".dq_groups AS g
    SET turn = t.turn,
        last_leased_at = now_at,
        wake_at = now_at + g.min_interval
    FROM unnest(v_turned, v_turn_values) AS t (grp, turn)
    WHERE g.queue = v_queue AND g.channel = ANY(v_turned) AND g.channel = t.grp;

    -- The rows stay locked by this transaction, so their addresses (ctid)
    -- still find them.
    RETURN QUERY
    WITH leased AS (
        UPDATE "public".dq_messages AS m
        SET attempts = m.attempts + 1,
            lock_token = "public".dq__token(m.id, (SELECT "public".dq__token_proof())),
            due_at = now_at + lease,
            leased_at = now_at,
            leased_due_at = m.due_at
        FROM unnest(v_rows) WITH ORDINALITY AS picked (row_at, pos)
        WHERE m.ctid = picked.row_at
        RETURNING
            picked.pos,
            m.id, m.queue, m.key, m.payload, m.state, m.scheduled_at,
            m.created_at, m.attempts, m.lock_token, m.due_at, m.channel, m.priority, m.headers
    )

    SELECT
        l.id, l.queue::text, l.key::text, l.payload, l.state, l.scheduled_at,
        l.created_at, l.attempts, l.attempts > 1, l.lock_token, l.due_at,
        nullif(l.channel, '')::text, l.priority, l.headers
    FROM leased AS l
    ORDER BY l.pos;
END
$$;

-- The earliest time at which a message of a grouped queue could be
-- eligible, as seen at now_at (NULL: no message); stops early with a time
-- before stop_below as soon as it finds one (NULL: never stops early).
-- Groups asleep are read in wake_at order, each a lower bound of its time.
CREATE FUNCTION dq__grouped_next_due(queue text, now_at timestamptz, stop_below timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off  -- the header
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_stop timestamptz := coalesce(stop_below, '-infinity');
    v_best timestamptz := "public".dq__group_first_due(queue, '');
    v_group record;
BEGIN
    IF v_best < v_stop THEN
        RETURN v_best;
    END IF;
    FOR v_group IN
        -- awake, or whose wake time has passed: read as they are now
        SELECT g.channel, g.max_concurrency, g.min_interval, g.last_leased_at, NULL AS wake_at
        FROM "public".dq_groups AS g
        WHERE g.queue = dq__grouped_next_due.queue AND g.channel <> '' AND g.wake_at IS NULL
        UNION ALL
        (
            SELECT g.channel, g.max_concurrency, g.min_interval, g.last_leased_at,
                CASE WHEN g.wake_at > now_at THEN g.wake_at END
            FROM "public".dq_groups AS g
            WHERE g.queue = dq__grouped_next_due.queue AND g.wake_at IS NOT NULL
            ORDER BY g.wake_at
        )
    LOOP
        EXIT WHEN v_group.wake_at >= v_best;
        v_best := least(v_best, "public".dq__group_next_eligible(
            queue, v_group.channel, v_group.max_concurrency, v_group.min_interval,
            v_group.last_leased_at, now_at
        ));
        EXIT WHEN v_best < v_stop;
    END LOOP;
    RETURN v_best;
END
$$;

-- dq__wake_if_head for a message with a channel or a priority, due at
-- written_at: wake idle consumers when nothing else of the grouped queue
-- could be eligible before it.
CREATE FUNCTION dq__wake_if_first(queue text, written_at timestamptz, now_at timestamptz) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off  -- the header
AS $$
BEGIN
    IF written_at <= coalesce("public".dq__grouped_next_due(queue, now_at, written_at), 'infinity') THEN
        PERFORM "public".dq__wake(queue);
    END IF;
END
$$;

-- Dead letters and per-queue settings (additions to version 1 of the SQL API): give up on a
-- message, list, redrive and purge what was given up on, and cap the
-- deliveries a message may get.

-- Set queue's max_attempts (NULL: no limit); polls enforce it from then on.
CREATE FUNCTION dq_configure(queue text, max_attempts integer) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := "public".dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM "public".dq__check_queue(dq_configure.queue);
    IF max_attempts <= 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('pgdq: max_attempts must be positive or NULL, got %s', max_attempts);
    END IF;
    INSERT INTO "public".dq_queues AS q (queue, max_attempts)
    VALUES (dq_configure.queue, dq_configure.max_attempts)
    ON CONFLICT (queue) DO UPDATE SET max_attempts = excluded.max_attempts;
END
$$;

-- Why a poll gave up on a message after max_attempts deliveries: how its
-- last delivery ended (nacked, or its lease expired), and the error of the
-- last nack when it gave one (last_error).
CREATE FUNCTION dq__gave_up_error(max_attempts integer, nacked boolean, last_error text) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT format('pgdq: gave up after %s deliveries (max_attempts %s): ', max_attempts, max_attempts)
        || CASE
            WHEN nacked THEN 'the last delivery was nacked' || coalesce(': ' || last_error, '')
            ELSE 'the last lease expired without an ack or nack'
                || coalesce('; an earlier delivery was nacked: ' || last_error, '')
        END
$$;

-- Move the (locked, current) messages ids to the dead letters, failed at
-- failed_at, with error; or, when max_attempts is given (a poll enforcing
-- it), each with why the poll gave up on it (dq__gave_up_error). The number
-- moved. The one place that buries messages.
CREATE FUNCTION dq__bury(
    ids bigint[], error text, failed_at timestamptz, max_attempts integer
) RETURNS integer
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
SET "dq.outcome" = 'dead'  -- what the history records (57_history.sql)
AS $$
    WITH moved AS (
        DELETE FROM "public".dq_messages AS m
        WHERE m.id = ANY(dq__bury.ids)
        RETURNING m.queue, m.key, m.id, m.payload, m.state, m.scheduled_at, m.created_at, m.attempts,
            m.lock_token IS NULL AS nacked, m.last_error, m.channel, m.priority, m.headers
    ),

    buried AS (
        INSERT INTO "public".dq_dead_letters AS d (
            queue, key, id, payload, state, scheduled_at, created_at, attempts, error, failed_at,
            channel, priority, headers
        )
        SELECT mv.queue, mv.key, mv.id, mv.payload, mv.state, mv.scheduled_at, mv.created_at, mv.attempts,
            CASE
                WHEN dq__bury.max_attempts IS NULL THEN dq__bury.error
                ELSE "public".dq__gave_up_error(dq__bury.max_attempts, mv.nacked, mv.last_error)
            END,
            dq__bury.failed_at,
            mv.channel, mv.priority, mv.headers
        FROM moved AS mv
        ORDER BY mv.queue, mv.key, mv.id
        -- a keyed message replaces its key's dead letter; a keyless one adds its own
        ON CONFLICT (queue, key) WHERE key IS NOT NULL DO UPDATE
            SET id = excluded.id,
                payload = excluded.payload,
                state = excluded.state,
                scheduled_at = excluded.scheduled_at,
                created_at = excluded.created_at,
                attempts = excluded.attempts,
                error = excluded.error,
                failed_at = excluded.failed_at,
                channel = excluded.channel,
                priority = excluded.priority,
                headers = excluded.headers
        RETURNING 1
    )

    SELECT count(*)::integer FROM buried
$$;

-- Give up on a leased message: move it to the dead letters with error (the
-- consumer's verdict, as given); false (nothing changed) for a stale token,
-- and with queue given, for a token of another queue's message (1.2).
CREATE FUNCTION dq_dead_letter(lock_token uuid, error text DEFAULT NULL, queue text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
    v_message record;
BEGIN
    IF dq_dead_letter.queue IS NOT NULL AND NOT "public".dq__valid_queue(dq_dead_letter.queue) THEN
        PERFORM "public".dq__check_queue(dq_dead_letter.queue);
    END IF;
    -- lock it, with the verdict as its last error: what its history
    -- record says (1.3), as its dead letter does
    UPDATE "public".dq_messages AS m
    SET last_error = dq_dead_letter.error
    WHERE m.id = "public".dq__token_id(dq_dead_letter.lock_token)
        AND m.lock_token = dq_dead_letter.lock_token
        AND (dq_dead_letter.queue IS NULL OR m.queue = dq_dead_letter.queue)
    RETURNING m.id, m.queue, m.channel, m.due_at INTO v_message;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    PERFORM "public".dq__bury(ARRAY[v_message.id], dq_dead_letter.error, v_now, NULL::integer);
    PERFORM "public".dq__leases_ended(
        ARRAY[v_message.queue::text], ARRAY[v_message.channel::text], ARRAY[v_message.due_at], v_now
    );
    RETURN TRUE;
END
$$;

-- How many dead letters queue has, and its latest failure: its range of
-- dq_dead_letters_failed, whatever the statistics say (as dq__queue_stats).
CREATE FUNCTION dq__dead_queue_stats(queue text) RETURNS TABLE (dead bigint, last_failed_at timestamptz)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
    SELECT count(*), max(d.failed_at)
    FROM "public".dq_dead_letters AS d
    WHERE d.queue = dq__dead_queue_stats.queue;
$$;

-- One row per queue with dead letters (or only queue's, if given): how many,
-- and the latest failure.
CREATE FUNCTION dq_dead_stats(queue text DEFAULT NULL) RETURNS TABLE (
    queue text,
    dead bigint,
    last_failed_at timestamptz
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT "public".dq_now();  -- unused: an invalid dq.now fails every call
    SELECT "public".dq__check_queue(dq_dead_stats.queue) WHERE dq_dead_stats.queue IS NOT NULL;
    SELECT d.queue::text, count(*), max(d.failed_at)
    FROM "public".dq_dead_letters AS d
    WHERE dq_dead_stats.queue IS NULL
    GROUP BY d.queue
    UNION ALL
    -- a named queue: its dead letters only (1.2: it read every queue's)
    SELECT dq_dead_stats.queue, s.dead, s.last_failed_at
    FROM "public".dq__dead_queue_stats(dq_dead_stats.queue) AS s
    WHERE dq_dead_stats.queue IS NOT NULL AND s.dead > 0
    ORDER BY 1;
$$;

-- Up to max_count of queue's dead letters, oldest failure first (then by
-- key, keyless ones last, by id).
CREATE FUNCTION dq_dead_list(queue text, max_count integer DEFAULT 100) RETURNS TABLE (
    queue text,
    key text,
    payload jsonb,
    state jsonb,
    scheduled_at timestamptz,
    created_at timestamptz,
    attempts integer,
    error text,
    failed_at timestamptz,
    id bigint  -- since 1.2: the message's id when it failed
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- the checks are statements of their own: each runs, row or no row
    SELECT "public".dq_now();  -- unused: an invalid dq.now fails every call
    SELECT "public".dq__check_queue(dq_dead_list.queue);
    SELECT "public".dq__null_check(dq_dead_list.max_count IS NULL, 'max_count');
    SELECT d.queue::text, d.key::text, d.payload, d.state, d.scheduled_at, d.created_at, d.attempts, d.error, d.failed_at,
        d.id
    FROM "public".dq_dead_letters AS d
    WHERE d.queue = dq_dead_list.queue
    ORDER BY d.failed_at, d.key, d.id
    LIMIT greatest(dq_dead_list.max_count, 0);
$$;

-- Offer queue's dead letters again (only key's when given), due at
-- scheduled_at (NULL: now), fresh: attempts 0, no state. A dead letter whose
-- key has a live message again is left where it is. The number re-offered.
CREATE FUNCTION dq_dead_redrive(
    queue text,
    key text DEFAULT NULL,
    scheduled_at timestamptz DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
    v_queue text := dq_dead_redrive.queue;
    v_key text := dq_dead_redrive.key;
    v_at timestamptz := coalesce(dq_dead_redrive.scheduled_at, v_now);
    v_count integer := 0;
BEGIN
    PERFORM "public".dq__check_queue(v_queue);
    IF v_key IS NOT NULL THEN
        PERFORM "public".dq__check_key(v_key, 'key');
    END IF;
    PERFORM "public".dq__check_time(dq_dead_redrive.scheduled_at, 'scheduled_at');
    v_count := "public".dq__redrive_keyed(v_queue, v_key, NULL::bigint, v_at, v_now);
    -- keyless dead letters come back as new keyless messages (1.2)
    IF v_key IS NULL THEN
        v_count := v_count + cardinality("public".dq__redrive_keyless(v_queue, NULL::bigint[], v_at, v_now));
    END IF;
    RETURN v_count;
END
$$;

-- Move queue's keyed dead letters (only key's, and only the one of id, when
-- given) back into the queue due at at, but those whose key has a live
-- message; the number moved.
-- Every statement goes by index probes, arrays and row addresses, whatever
-- the table statistics say (pgtap/99_stale_statistics.sql): with them stale,
-- the check for live keys was planned as a scan of the queue's messages for
-- each dead letter (1.1; minutes for 50,000). enable_seqscan = off keeps a
-- table that looks empty from being scanned instead of probed.
CREATE FUNCTION dq__redrive_keyed(queue text, key text, id bigint, at timestamptz, now_at timestamptz) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_offered text[];        -- the keys offered, in key order
    v_offered_rows tid[];    -- their new messages (this transaction's rows)
    v_dead_rows tid[];
    v_keys text[];           -- the keys whose dead letters were removed, in key order
    v_payloads jsonb[];
    v_channels text[];
    v_priorities integer[];
    v_headers jsonb[];
BEGIN
    -- Lock order (docs/sql-reference.md, Concurrency): messages in key
    -- order, then dead letters in key order, the order a bury takes them in
    -- (it holds the message when it writes the dead letter). So first the
    -- messages. ON CONFLICT DO NOTHING skips every key that has a live
    -- message, however recently offered; the probe skips those this
    -- session sees, so that a key a poll is burying is left alone without
    -- waiting for that poll. Both go by this statement's snapshot, which is
    -- stale after an insert waited (for an offer, ack or bury of that key):
    -- meanwhile a later key may have been buried again, its dead letter
    -- replaced (or purged). The statements after it set that right.
    WITH offered AS (
        INSERT INTO "public".dq_messages AS m (
            queue, key, payload, scheduled_at, due_at, created_at, channel, priority, headers
        )
        SELECT dq__redrive_keyed.queue, d.key, d.payload, at, at, now_at, d.channel, d.priority, d.headers
        FROM "public".dq_dead_letters AS d
        WHERE d.queue = dq__redrive_keyed.queue AND d.key IS NOT NULL
            AND (dq__redrive_keyed.key IS NULL OR d.key = dq__redrive_keyed.key)
            AND (dq__redrive_keyed.id IS NULL OR d.id = dq__redrive_keyed.id)
            -- a probe of the key index per dead letter (not NOT EXISTS, which
            -- a join may turn into a scan of the queue per dead letter)
            AND (
                SELECT live.id FROM "public".dq_messages AS live
                WHERE live.queue = dq__redrive_keyed.queue AND live.key = d.key
            ) IS NULL
        ORDER BY d.key
        ON CONFLICT (queue, key) WHERE key IS NOT NULL DO NOTHING
        RETURNING m.key, m.ctid
    )

    SELECT coalesce(array_agg(o.key ORDER BY o.key), '{}'), coalesce(array_agg(o.ctid ORDER BY o.key), '{}')
    INTO v_offered, v_offered_rows
    FROM offered AS o;

    -- Then their dead letters, locked afresh in key order and removed (a
    -- second statement: its snapshot sees the versions just locked). Run
    -- even when nothing was offered, so that a caller who may not remove
    -- dead letters is refused whether there were any or not.
    v_dead_rows := ARRAY(
        SELECT d.ctid FROM "public".dq_dead_letters AS d
        WHERE d.queue = dq__redrive_keyed.queue AND d.key = ANY(v_offered)
            -- a dead letter replaced meanwhile (its key buried again) is
            -- another one: not the one of id asked for
            AND (dq__redrive_keyed.id IS NULL OR d.id = dq__redrive_keyed.id)
        ORDER BY d.key
        FOR UPDATE
    );
    WITH removed AS (
        DELETE FROM "public".dq_dead_letters AS d
        WHERE d.ctid = ANY(v_dead_rows)
        RETURNING d.key, d.payload, d.channel, d.priority, d.headers
    )

    SELECT
        coalesce(array_agg(r.key ORDER BY r.key), '{}'), array_agg(r.payload ORDER BY r.key),
        array_agg(r.channel ORDER BY r.key), array_agg(r.priority ORDER BY r.key),
        array_agg(r.headers ORDER BY r.key)
    INTO v_keys, v_payloads, v_channels, v_priorities, v_headers
    FROM removed AS r;

    -- What is re-offered is exactly what was removed: a message whose dead
    -- letter is gone is withdrawn, and each other one takes the content of
    -- the dead letter removed (a newer one when its key was buried again
    -- meanwhile). Usually there is nothing to set right.
    IF v_keys IS DISTINCT FROM v_offered THEN
        v_offered_rows := "public".dq__withdraw(v_offered, v_offered_rows, v_keys);
    END IF;
    UPDATE "public".dq_messages AS m
    SET payload = r.payload, channel = r.channel, priority = r.priority, headers = r.headers
    FROM unnest(v_offered_rows, v_payloads, v_channels, v_priorities, v_headers) AS r (row_at, payload, channel, priority, headers)
    WHERE m.ctid = r.row_at
        AND (m.payload, m.channel, m.priority, m.headers) IS DISTINCT FROM (r.payload, r.channel, r.priority, r.headers);

    IF cardinality(v_keys) > 0 THEN
        PERFORM "public".dq__offers_written(
            dq__redrive_keyed.queue, v_channels, v_priorities,
            array_fill(at, ARRAY[cardinality(v_keys)]), NULL::boolean[], now_at
        );
    END IF;
    RETURN cardinality(v_keys);
END
$$;

-- Delete the messages of offered (keys in key order, at rows) whose key is
-- not in kept (a subsequence of offered): the rows of the rest, in order.
-- One merge pass over the two sorted arrays.
CREATE FUNCTION dq__withdraw(offered text[], rows tid[], kept text[]) RETURNS tid[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_kept_rows tid[] := '{}';
    v_gone tid[] := '{}';
    v_next integer := 1;  -- the next key of kept to meet
BEGIN
    FOR i IN 1 .. coalesce(cardinality(offered), 0) LOOP
        IF v_next <= cardinality(kept) AND offered[i] = kept[v_next] THEN
            v_kept_rows := v_kept_rows || rows[i];
            v_next := v_next + 1;
        ELSE
            v_gone := v_gone || rows[i];
        END IF;
    END LOOP;
    DELETE FROM "public".dq_messages AS m WHERE m.ctid = ANY(v_gone);
    RETURN v_kept_rows;
END
$$;

-- Move queue's keyless dead letters (only those of ids, when not NULL) back
-- into the queue as new keyless messages due at at: their new ids, in the
-- order of their old ones. Locks the dead letters in id order.
CREATE FUNCTION dq__redrive_keyless(queue text, ids bigint[], at timestamptz, now_at timestamptz)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_rows tid[];
    v_new bigint[];
    v_channels text[];
    v_priorities integer[];
BEGIN
    v_rows := ARRAY(
        SELECT d.ctid FROM "public".dq_dead_letters AS d
        WHERE d.queue = dq__redrive_keyless.queue AND d.key IS NULL
            AND (dq__redrive_keyless.ids IS NULL OR d.id = ANY(dq__redrive_keyless.ids))
        ORDER BY d.id
        FOR UPDATE
    );
    IF cardinality(v_rows) = 0 THEN
        RETURN '{}';
    END IF;
    -- keyless dead letters are never updated, only deleted: the addresses
    -- locked are the versions this statement sees (a TID scan, whatever the
    -- statistics say)
    WITH removed AS (
        DELETE FROM "public".dq_dead_letters AS d
        WHERE d.ctid = ANY(v_rows)
        RETURNING d.id, d.payload, d.channel, d.priority, d.headers
    ),

    offered AS (
        INSERT INTO "public".dq_messages AS m (
            queue, payload, scheduled_at, due_at, created_at, channel, priority, headers
        )
        SELECT dq__redrive_keyless.queue, r.payload, at, at, now_at, r.channel, r.priority, r.headers
        FROM removed AS r
        ORDER BY r.id
        RETURNING m.id, m.channel, m.priority
    )

    SELECT array_agg(o.id ORDER BY o.id), array_agg(o.channel), array_agg(o.priority)
    INTO v_new, v_channels, v_priorities
    FROM offered AS o;
    PERFORM "public".dq__offers_written(
        queue, v_channels, v_priorities, array_fill(at, ARRAY[cardinality(v_new)]), NULL::boolean[], now_at
    );
    RETURN v_new;
END
$$;

-- Offer queue's dead letter id again (keyed or keyless), due at
-- scheduled_at (NULL: now), as dq_dead_redrive does: the id of the message
-- it became; NULL when queue has no such dead letter, or when its key has a
-- live message again (the dead letter stays), or when its key was buried
-- again meanwhile (the newer dead letter is another one, and stays).
CREATE FUNCTION dq_dead_redrive_id(
    queue text,
    id bigint,
    scheduled_at timestamptz DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
    v_key text;
BEGIN
    PERFORM "public".dq__check_queue(dq_dead_redrive_id.queue);
    PERFORM "public".dq__null_check(dq_dead_redrive_id.id IS NULL, 'id');
    PERFORM "public".dq__check_time(dq_dead_redrive_id.scheduled_at, 'scheduled_at');
    -- (ids of dead letters restored from a 1.0.0 dump may repeat: the first key)
    SELECT d.key INTO v_key
    FROM "public".dq_dead_letters AS d
    WHERE d.queue = dq_dead_redrive_id.queue AND d.id = dq_dead_redrive_id.id
    ORDER BY d.key NULLS FIRST
    LIMIT 1;
    IF NOT FOUND THEN
        -- a redrive of nothing, so that a caller who may not redrive is
        -- refused whether the dead letter exists or not
        PERFORM "public".dq__redrive_keyed(dq_dead_redrive_id.queue, '', NULL::bigint, v_now, v_now);
        RETURN NULL;
    ELSIF v_key IS NULL THEN
        RETURN ("public".dq__redrive_keyless(
            dq_dead_redrive_id.queue, ARRAY[dq_dead_redrive_id.id],
            coalesce(dq_dead_redrive_id.scheduled_at, v_now), v_now
        ))[1];
    ELSIF "public".dq__redrive_keyed(
        dq_dead_redrive_id.queue, v_key, dq_dead_redrive_id.id,
        coalesce(dq_dead_redrive_id.scheduled_at, v_now), v_now
    ) = 0 THEN
        RETURN NULL;
    END IF;
    RETURN (
        SELECT m.id FROM "public".dq_messages AS m
        WHERE m.queue = dq_dead_redrive_id.queue AND m.key = v_key
    );
END
$$;

-- Delete queue's dead letters (only key's when given); the count deleted.
CREATE FUNCTION dq_dead_purge(queue text, key text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_clock timestamptz := "public".dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM "public".dq__check_queue(dq_dead_purge.queue);
    IF dq_dead_purge.key IS NOT NULL THEN
        PERFORM "public".dq__check_key(dq_dead_purge.key, 'key');
    END IF;
    RETURN "public".dq__dead_delete(dq_dead_purge.queue, dq_dead_purge.key, NULL::bigint);
END
$$;

-- Delete queue's dead letter id (keyed or keyless, since 1.2); the count
-- deleted (more than one only for ids a 1.0.0 dump restored twice).
CREATE FUNCTION dq_dead_purge_id(queue text, id bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_clock timestamptz := "public".dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM "public".dq__check_queue(dq_dead_purge_id.queue);
    PERFORM "public".dq__null_check(dq_dead_purge_id.id IS NULL, 'id');
    RETURN "public".dq__dead_delete(dq_dead_purge_id.queue, NULL::text, dq_dead_purge_id.id);
END
$$;

-- Delete queue's dead letters, only key's and only id's when given; the
-- count deleted. Locks in key order (keyless ones last, by id), like every
-- multi-row writer (a poll burying messages upserts their dead letters in
-- that order), so none deadlock; deletes by address, a TID scan whatever
-- the statistics say.
CREATE FUNCTION dq__dead_delete(queue text, key text, id bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_rows tid[];
    v_deleted bigint;
BEGIN
    -- a locked row may have been replaced meanwhile (a key buried again):
    -- the second statement's fresh snapshot sees the version locked
    v_rows := ARRAY(
        SELECT d.ctid FROM "public".dq_dead_letters AS d
        WHERE d.queue = dq__dead_delete.queue
            AND (dq__dead_delete.key IS NULL OR d.key = dq__dead_delete.key)
            AND (dq__dead_delete.id IS NULL OR d.id = dq__dead_delete.id)
        ORDER BY d.key, d.id
        FOR UPDATE
    );
    DELETE FROM "public".dq_dead_letters AS d
    WHERE d.ctid = ANY(v_rows);
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$$;

-- Managing: cancel, get, peek, purge, stats, next_due.
-- The reading functions are LANGUAGE sql: their argument checks are
-- statements of their own, so each runs whether or not a row is read, and
-- their result columns may repeat their arguments' names.

-- Delete queue's message id (NULL: none), leased or not, freeing the slot
-- its lease held; its history record says outcome ('acked' or 'cancelled').
-- True if one was deleted. The one place that cancels and finishes: the
-- public functions below only name the outcome, which is set for this call
-- alone (the SET clause restores the caller's dq.outcome on return), so no
-- caller's setting reaches the record (57_history.sql).
CREATE FUNCTION dq__cancel(queue text, id bigint, outcome text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET "dq.outcome" = ''
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
    v_channel text;
    v_due_at timestamptz;
BEGIN
    IF dq__cancel.outcome IS DISTINCT FROM 'acked' AND dq__cancel.outcome IS DISTINCT FROM 'cancelled' THEN
        RAISE EXCEPTION 'pgdq: outcome must be acked or cancelled' USING ERRCODE = '22023';
    END IF;
    PERFORM set_config('dq.outcome', dq__cancel.outcome, true);
    DELETE FROM "public".dq_messages AS m
    WHERE m.id = dq__cancel.id AND m.queue = dq__cancel.queue
    RETURNING m.channel, CASE WHEN m.lock_token IS NOT NULL THEN m.due_at END INTO v_channel, v_due_at;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    PERFORM "public".dq__leases_ended(ARRAY[dq__cancel.queue], ARRAY[v_channel], ARRAY[v_due_at], v_now);
    RETURN TRUE;
END
$$;

-- dq__cancel of queue's message of key, the arguments checked (dq_cancel,
-- dq_finish).
CREATE FUNCTION dq__cancel_key(queue text, key text, outcome text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM "public".dq__check_queue(dq__cancel_key.queue);
    PERFORM "public".dq__check_key(dq__cancel_key.key, 'key');
    RETURN "public".dq__cancel(dq__cancel_key.queue, (
        SELECT m.id FROM "public".dq_messages AS m
        WHERE m.queue = dq__cancel_key.queue AND m.key = dq__cancel_key.key
    ), dq__cancel_key.outcome);
END
$$;

-- dq__cancel of queue's message id (keyed or keyless), the arguments
-- checked (dq_cancel_id, dq_finish_id).
CREATE FUNCTION dq__cancel_id(queue text, id bigint, outcome text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM "public".dq__check_queue(dq__cancel_id.queue);
    PERFORM "public".dq__null_check(dq__cancel_id.id IS NULL, 'id');
    RETURN "public".dq__cancel(dq__cancel_id.queue, dq__cancel_id.id, dq__cancel_id.outcome);
END
$$;

-- Delete one message, leased or not; true if one was deleted.
CREATE FUNCTION dq_cancel(queue text, key text) RETURNS boolean
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$ SELECT "public".dq__cancel_key(queue, key, 'cancelled') $$;

-- Delete one message as done, leased or not (1.3; its history record says
-- 'acked', as an ack's does); true if one was deleted.
CREATE FUNCTION dq_finish(queue text, key text) RETURNS boolean
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$ SELECT "public".dq__cancel_key(queue, key, 'acked') $$;

-- Delete queue's message id (keyed or keyless, since 1.2), leased or not;
-- true if one was deleted.
CREATE FUNCTION dq_cancel_id(queue text, id bigint) RETURNS boolean
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$ SELECT "public".dq__cancel_id(queue, id, 'cancelled') $$;

-- Delete queue's message id as done (1.3; dq_finish by id: recorded
-- 'acked'); true if one was deleted.
CREATE FUNCTION dq_finish_id(queue text, id bigint) RETURNS boolean
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$ SELECT "public".dq__cancel_id(queue, id, 'acked') $$;

-- queue's message id (NULL: none) as dq_get describes it: the one place
-- that does.
CREATE FUNCTION dq__get(queue text, id bigint) RETURNS TABLE (
    queue text,
    key text,
    payload jsonb,
    state jsonb,
    scheduled_at timestamptz,
    due_at timestamptz,
    attempts integer,
    leased boolean,
    created_at timestamptz,
    channel text,
    priority integer,
    headers jsonb  -- since 1.2
)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT
        m.queue::text, m.key::text, m.payload, m.state, m.scheduled_at,
        m.due_at, m.attempts,
        "public".dq__is_leased(m.lock_token, m.due_at, n.now_at),
        m.created_at, nullif(m.channel, '')::text, m.priority, m.headers
    FROM "public".dq_messages AS m
    CROSS JOIN "public".dq_now() AS n (now_at)
    WHERE m.id = dq__get.id AND m.queue = dq__get.queue;
$$;

-- Read one message without locking or changing it (zero or one row).
CREATE FUNCTION dq_get(queue text, key text) RETURNS TABLE (
    queue text,
    key text,
    payload jsonb,
    state jsonb,
    scheduled_at timestamptz,
    due_at timestamptz,
    attempts integer,
    leased boolean,
    created_at timestamptz,
    channel text,
    priority integer,
    headers jsonb  -- since 1.2
)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT "public".dq_now();  -- unused: an invalid dq.now fails every call
    SELECT "public".dq__check_queue(dq_get.queue);
    SELECT "public".dq__check_key(dq_get.key, 'key');
    SELECT d.* FROM "public".dq__get(dq_get.queue, (
        SELECT m.id FROM "public".dq_messages AS m
        WHERE m.queue = dq_get.queue AND m.key = dq_get.key
    )) AS d;
$$;

-- Read queue's message id (keyed or keyless, since 1.2) as dq_get does.
CREATE FUNCTION dq_get_id(queue text, id bigint) RETURNS TABLE (
    queue text,
    key text,
    payload jsonb,
    state jsonb,
    scheduled_at timestamptz,
    due_at timestamptz,
    attempts integer,
    leased boolean,
    created_at timestamptz,
    channel text,
    priority integer,
    headers jsonb  -- since 1.2
)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT "public".dq_now();  -- unused: an invalid dq.now fails every call
    SELECT "public".dq__check_queue(dq_get_id.queue);
    SELECT "public".dq__null_check(dq_get_id.id IS NULL, 'id');
    SELECT d.* FROM "public".dq__get(dq_get_id.queue, dq_get_id.id) AS d;
$$;

-- True when a message (lock_token, due_at) is in condition which at now_at
-- ('due', 'delayed', 'leased'; NULL: any). Inlines into dq_peek.
CREATE FUNCTION dq__in_condition(
    which text, lock_token uuid, due_at timestamptz, now_at timestamptz
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE which
        WHEN 'due' THEN due_at OPERATOR(pg_catalog.<=) now_at
        WHEN 'delayed' THEN due_at OPERATOR(pg_catalog.>) now_at AND lock_token IS NULL
        WHEN 'leased' THEN "public".dq__is_leased(lock_token, due_at, now_at)
        ELSE TRUE
    END
$$;

-- Browse queue without locking or changing anything: up to max_count
-- messages (1..1000) in one condition (which: 'due', 'delayed', 'leased';
-- NULL: all), by due time then key (keyless ones last, by id); never a
-- lock token.
CREATE FUNCTION dq_peek(
    queue text,
    which text DEFAULT NULL,
    max_count integer DEFAULT 100
) RETURNS TABLE (
    key text,
    payload jsonb,
    state jsonb,
    scheduled_at timestamptz,
    due_at timestamptz,
    attempts integer,
    leased boolean,
    lease_until timestamptz,
    last_error text,
    id bigint,  -- since 1.2
    headers jsonb  -- since 1.2
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT "public".dq_now();  -- unused: an invalid dq.now fails every call
    SELECT "public".dq__check_queue(dq_peek.queue);
    SELECT "public".dq__check_one_of(dq_peek.which, 'which', ARRAY['due', 'delayed', 'leased']);
    SELECT "public".dq__check_between(dq_peek.max_count, 'max_count', 1, 1000);
    SELECT
        m.key::text, m.payload, m.state, m.scheduled_at, m.due_at, m.attempts,
        l.leased,
        CASE WHEN l.leased THEN m.due_at END,
        m.last_error,
        m.id,
        m.headers
    FROM (
        -- the first max_count of each poll index in due order, merged
        (
            SELECT p.key, p.payload, p.state, p.scheduled_at, p.due_at, p.attempts, p.lock_token, p.last_error, p.id, p.headers
            FROM "public".dq_messages AS p
            CROSS JOIN "public".dq_now() AS n (now_at)
            WHERE p.queue = dq_peek.queue AND p.channel = '' AND p.priority = 0
                AND "public".dq__in_condition(dq_peek.which, p.lock_token, p.due_at, n.now_at)
            ORDER BY p.due_at, p.key, p.id
            LIMIT dq_peek.max_count
        )
        UNION ALL
        (
            SELECT g.key, g.payload, g.state, g.scheduled_at, g.due_at, g.attempts, g.lock_token, g.last_error, g.id, g.headers
            FROM "public".dq_messages AS g
            CROSS JOIN "public".dq_now() AS n (now_at)
            WHERE g.queue = dq_peek.queue AND (g.channel <> '' OR g.priority <> 0)
                AND "public".dq__in_condition(dq_peek.which, g.lock_token, g.due_at, n.now_at)
            ORDER BY g.due_at, g.key, g.id
            LIMIT dq_peek.max_count
        )
    ) AS m
    CROSS JOIN "public".dq_now() AS n (now_at)
    CROSS JOIN LATERAL (SELECT "public".dq__is_leased(m.lock_token, m.due_at, n.now_at)) AS l (leased)
    ORDER BY m.due_at, m.key, m.id
    LIMIT dq_peek.max_count;
$$;

-- Browse queue a page at a time (1.2; the dashboard's list): as dq_peek,
-- with only keys starting with key_prefix (NULL: any) and only messages
-- after (after_due_at, after_id) in (due time, id) order, the last row of
-- the page before (NULL: from the start). Without a prefix it reads the
-- head of the queue's ranges of the poll indexes from that point; with one,
-- the prefix's range of the key index (keyless messages have no key: none
-- match a prefix), sorted.
CREATE FUNCTION dq_browse(
    queue text,
    which text DEFAULT NULL,
    key_prefix text DEFAULT NULL,
    after_due_at timestamptz DEFAULT NULL,
    after_id bigint DEFAULT NULL,
    max_count integer DEFAULT 100
) RETURNS TABLE (
    key text,
    payload jsonb,
    state jsonb,
    scheduled_at timestamptz,
    due_at timestamptz,
    attempts integer,
    leased boolean,
    lease_until timestamptz,
    last_error text,
    id bigint,
    headers jsonb
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT "public".dq_now();  -- unused: an invalid dq.now fails every call
    SELECT "public".dq__check_queue(dq_browse.queue);
    SELECT "public".dq__check_one_of(dq_browse.which, 'which', ARRAY['due', 'delayed', 'leased']);
    SELECT "public".dq__check_key(dq_browse.key_prefix, 'key_prefix') WHERE dq_browse.key_prefix IS NOT NULL;
    SELECT "public".dq__check_between(dq_browse.max_count, 'max_count', 1, 1000);
    SELECT
        m.key::text, m.payload, m.state, m.scheduled_at, m.due_at, m.attempts,
        l.leased, CASE WHEN l.leased THEN m.due_at END, m.last_error, m.id, m.headers
    FROM (
        (
            SELECT p.* FROM "public".dq_messages AS p
            WHERE dq_browse.key_prefix IS NULL
                AND p.queue = dq_browse.queue AND p.channel = '' AND p.priority = 0
                AND (dq_browse.after_due_at IS NULL OR (p.due_at, p.id) > (dq_browse.after_due_at, coalesce(dq_browse.after_id, 0)))
                AND "public".dq__in_condition(dq_browse.which, p.lock_token, p.due_at, "public".dq_now())
            ORDER BY p.due_at, p.id
            LIMIT dq_browse.max_count
        )
        UNION ALL
        (
            SELECT g.* FROM "public".dq_messages AS g
            WHERE dq_browse.key_prefix IS NULL
                AND g.queue = dq_browse.queue AND (g.channel <> '' OR g.priority <> 0)
                AND (dq_browse.after_due_at IS NULL OR (g.due_at, g.id) > (dq_browse.after_due_at, coalesce(dq_browse.after_id, 0)))
                AND "public".dq__in_condition(dq_browse.which, g.lock_token, g.due_at, "public".dq_now())
            ORDER BY g.due_at, g.id
            LIMIT dq_browse.max_count
        )
        UNION ALL
        (
            -- the prefix's range of the key index: from the prefix up to the
            -- prefix followed by the last code point, then checked exactly
            SELECT k.* FROM "public".dq_messages AS k
            WHERE dq_browse.key_prefix IS NOT NULL
                AND k.queue = dq_browse.queue
                AND k.key >= dq_browse.key_prefix AND k.key <= dq_browse.key_prefix || chr(1114111)
                AND starts_with(k.key, dq_browse.key_prefix)
                AND (dq_browse.after_due_at IS NULL OR (k.due_at, k.id) > (dq_browse.after_due_at, coalesce(dq_browse.after_id, 0)))
                AND "public".dq__in_condition(dq_browse.which, k.lock_token, k.due_at, "public".dq_now())
            ORDER BY k.due_at, k.id
            LIMIT dq_browse.max_count
        )
    ) AS m
    CROSS JOIN LATERAL (SELECT "public".dq__is_leased(m.lock_token, m.due_at, "public".dq_now())) AS l (leased)
    ORDER BY m.due_at, m.id
    LIMIT dq_browse.max_count;
$$;

-- Make queue's message id due now (1.2; the dashboard's "run now"): true
-- when it was delayed (not leased, due later); a leased or due message is
-- left as it is (false). Its scheduled_at, attempts and state stay.
CREATE FUNCTION dq_run_now(queue text, id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
    v_channel text;
    v_priority integer;
BEGIN
    PERFORM "public".dq__check_queue(dq_run_now.queue);
    PERFORM "public".dq__null_check(dq_run_now.id IS NULL, 'id');
    UPDATE "public".dq_messages AS m
    SET due_at = v_now
    WHERE m.id = dq_run_now.id AND m.queue = dq_run_now.queue AND m.lock_token IS NULL AND m.due_at > v_now
    RETURNING m.channel, m.priority INTO v_channel, v_priority;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    IF v_channel = '' AND v_priority = 0 THEN
        PERFORM "public".dq__wake_if_head(dq_run_now.queue, v_now);
        RETURN TRUE;
    END IF;
    -- its group comes due earlier (as an offer due now would make it)
    IF v_channel <> '' THEN
        PERFORM "public".dq__groups_touch(dq_run_now.queue, ARRAY[v_channel], ARRAY[v_now], '{FALSE}', v_now);
    END IF;
    PERFORM "public".dq__wake_if_first(dq_run_now.queue, v_now, v_now);
    RETURN TRUE;
END
$$;

-- Delete every message of queue; the count deleted.
CREATE FUNCTION dq_purge(queue text) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET "dq.outcome" = 'purged'  -- what the history records (57_history.sql)
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := "public".dq_now();  -- unused: an invalid dq.now fails every call
    v_rows tid[];
    v_deleted bigint;
BEGIN
    PERFORM "public".dq__check_queue(dq_purge.queue);
    -- Locks in key order, like dq_offer_many, so the two never deadlock
    -- (keyless messages last, by id).
    v_rows := ARRAY(
        SELECT m.ctid FROM "public".dq_messages AS m
        WHERE m.queue = dq_purge.queue AND "public".dq__in_poll_indexes(m.channel, m.priority)
        ORDER BY m.key, m.id
        FOR UPDATE OF m
    );
    -- Deleted by address (as dq_ack_many does): a TID scan whatever the
    -- statistics say, where a join back on id planned a nested loop over
    -- every pair of rows when the table was last analyzed empty (minutes
    -- for 100,000 messages).
    DELETE FROM "public".dq_messages AS m
    WHERE m.ctid = ANY(v_rows);
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    -- slots the leases held are free: every group of the queue looks again
    -- (and is forgotten if it has no message and no limits)
    UPDATE "public".dq_groups AS g
    SET wake_at = NULL
    WHERE g.queue = dq_purge.queue AND g.wake_at IS NOT NULL;
    RETURN v_deleted;
END
$$;

-- dq_stats of one queue (its counts at now; zeros when it has none), read
-- from its ranges of the two poll indexes, which between them hold every
-- message: it costs what the queue holds, whatever the statistics say (with
-- a generic plan, a queue looked as large as any and got a scan of every
-- queue's messages). The counts are those of dq_stats's overview.
CREATE FUNCTION dq__queue_stats(queue text) RETURNS TABLE (
    ready bigint,
    delayed bigint,
    leased bigint,
    oldest_ready_at timestamptz,
    next_due_at timestamptz
)
LANGUAGE sql VOLATILE  -- it reads dq_now, which can raise (20_checks.sql)
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
    SELECT
        count(*) FILTER (WHERE m.due_at <= n.now_at),
        count(*) FILTER (WHERE m.due_at > n.now_at AND m.lock_token IS NULL),
        count(*) FILTER (WHERE "public".dq__is_leased(m.lock_token, m.due_at, n.now_at)),
        min(m.due_at) FILTER (WHERE m.due_at <= n.now_at),
        min(m.due_at) FILTER (WHERE m.due_at > n.now_at AND m.lock_token IS NULL)
    FROM (
        SELECT p.due_at, p.lock_token
        FROM "public".dq_messages AS p
        WHERE p.queue = dq__queue_stats.queue AND p.channel = '' AND p.priority = 0
        UNION ALL
        SELECT g.due_at, g.lock_token
        FROM "public".dq_messages AS g
        WHERE g.queue = dq__queue_stats.queue AND (g.channel <> '' OR g.priority <> 0)
    ) AS m
    CROSS JOIN "public".dq_now() AS n (now_at);
$$;

-- dq_stats' overview from dq_counts (12_counts.sql) at now_at: whole bins
-- summed, the current bin's messages still ahead of now_at counted from the
-- poll indexes. The same rows as dq__scanned_stats, at the cost of the
-- counts and a few probes per queue, whatever the table holds.
--
-- What dq_counts cannot say about a queue (its messages due after now_at
-- and before the end of the current bin, delayed and leased; its oldest
-- ready due time and its next delayed one) is read per queue in the
-- statement itself (h): probes of the plain poll index, and a read of the
-- queue's entries in the grouped one (not in due order across channels;
-- one empty descent for a plain queue), as dq__queue_stats reads it. In
-- 1.2 a function did that per queue (dq__queue_head): its call, with its
-- SET clauses, cost 8 times the probes (2.2 s of 2.5 at 20,000 queues).
CREATE FUNCTION dq__counted_stats(now_at timestamptz) RETURNS TABLE (
    queue text,
    ready bigint,
    delayed bigint,
    leased bigint,
    oldest_ready_at timestamptz,
    next_due_at timestamptz
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off  -- probes, whatever the statistics say
SET jit = off  -- see 10_storage.sql
AS $$
    WITH queues AS (
        -- one pass over the counts, summed per queue by bin: before or in
        -- the bin holding now_at, or after it (leased or not)
        SELECT
            c.queue,
            coalesce(sum(c.n) FILTER (WHERE c.due_bin <= "public".dq__due_bin(now_at)), 0) AS due_by_bin,
            coalesce(
                sum(c.n) FILTER (WHERE c.due_bin > "public".dq__due_bin(now_at) AND NOT c.leased), 0
            ) AS delayed_later,
            coalesce(sum(c.n) FILTER (WHERE c.due_bin > "public".dq__due_bin(now_at) AND c.leased), 0) AS leased_later,
            -- which probes can find anything (h): none finds what no bin holds
            coalesce(sum(c.n) FILTER (WHERE c.due_bin = "public".dq__due_bin(now_at)), 0) AS in_bin,
            coalesce(
                sum(c.n) FILTER (WHERE c.due_bin >= "public".dq__due_bin(now_at) AND NOT c.leased), 0
            ) AS unleased_ahead
        FROM "public".dq_counts AS c
        GROUP BY c.queue
        HAVING sum(c.n) <> 0
    ),
    bin AS (
        SELECT now_at, "public".dq__due_bin(now_at) + "public".dq__due_bin_width() AS until_at
    )
    SELECT
        q.queue::text,
        q.due_by_bin - h.soon_delayed - h.soon_leased,
        q.delayed_later + h.soon_delayed,
        q.leased_later + h.soon_leased,
        h.oldest_ready_at,
        h.next_due_at
    FROM queues AS q
    CROSS JOIN bin AS t
    CROSS JOIN LATERAL (
        SELECT
            s.delayed + g.delayed AS soon_delayed,
            s.leased + g.leased AS soon_leased,
            least(
                (SELECT min(p.due_at) FROM "public".dq_messages AS p
                 WHERE q.due_by_bin <> 0
                    AND p.queue = q.queue AND p.channel = '' AND p.priority = 0 AND p.due_at <= t.now_at),
                g.oldest_ready_at
            ) AS oldest_ready_at,
            least(
                (SELECT p.due_at FROM "public".dq_messages AS p
                 WHERE q.unleased_ahead <> 0
                    AND p.queue = q.queue AND p.channel = '' AND p.priority = 0
                    AND p.due_at > t.now_at AND p.lock_token IS NULL
                 ORDER BY p.due_at LIMIT 1),
                g.next_due_at
            ) AS next_due_at
        FROM (
            SELECT
                count(*) FILTER (WHERE p.lock_token IS NULL) AS delayed,
                count(*) FILTER (WHERE p.lock_token IS NOT NULL) AS leased
            FROM "public".dq_messages AS p
            WHERE q.in_bin <> 0
                AND p.queue = q.queue AND p.channel = '' AND p.priority = 0
                AND p.due_at > t.now_at AND p.due_at < t.until_at
        ) AS s
        CROSS JOIN (
            SELECT
                count(*) FILTER (
                    WHERE g.due_at > t.now_at AND g.due_at < t.until_at AND g.lock_token IS NULL
                ) AS delayed,
                count(*) FILTER (
                    WHERE g.due_at > t.now_at AND g.due_at < t.until_at AND g.lock_token IS NOT NULL
                ) AS leased,
                min(g.due_at) FILTER (WHERE g.due_at <= t.now_at) AS oldest_ready_at,
                min(g.due_at) FILTER (WHERE g.due_at > t.now_at AND g.lock_token IS NULL) AS next_due_at
            FROM "public".dq_messages AS g
            WHERE g.queue = q.queue AND (g.channel <> '' OR g.priority <> 0)
        ) AS g
    ) AS h
    ORDER BY 1;
$$;

-- dq_stats' overview read from the table itself: one pass over every
-- message. What dq_counts is checked against (tests), and what dq_stats()
-- reads when it cannot read the counts (dq__overview_counted).
CREATE FUNCTION dq__scanned_stats(now_at timestamptz) RETURNS TABLE (
    queue text,
    ready bigint,
    delayed bigint,
    leased bigint,
    oldest_ready_at timestamptz,
    next_due_at timestamptz
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT
        m.queue::text,
        count(*) FILTER (WHERE m.due_at <= now_at),
        count(*) FILTER (WHERE m.due_at > now_at AND m.lock_token IS NULL),
        count(*) FILTER (WHERE "public".dq__is_leased(m.lock_token, m.due_at, now_at)),
        min(m.due_at) FILTER (WHERE m.due_at <= now_at),
        min(m.due_at) FILTER (WHERE m.due_at > now_at AND m.lock_token IS NULL)
    FROM "public".dq_messages AS m
    GROUP BY m.queue
    ORDER BY 1;
$$;

-- Whether dq_stats() at now_at reads the counts (dq__counted_stats): the
-- caller may read them and is not isolated by row-level security (12_counts.sql),
-- and the clock is not pinned more than 6 days back, before bins the counts
-- may have folded into '-infinity'. Otherwise it reads the table, as 1.1 did.
CREATE FUNCTION dq__overview_counted(now_at timestamptz) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT now_at >= pg_catalog.clock_timestamp() - interval '6 days'
        AND pg_catalog.has_table_privilege('"public".dq_counts', 'SELECT')
        AND NOT pg_catalog.row_security_active('"public".dq_messages');
$$;

-- Whether queue is paused (dq_pause); NULL for a caller that may not read
-- the queues' settings (a role granted only SELECT on dq_messages, whose
-- dq_stats worked in 1.1 and still does).
CREATE FUNCTION dq__paused(queue text) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT has_table_privilege('"public".dq_queues', 'SELECT') THEN
        RETURN NULL;
    END IF;
    RETURN EXISTS (
        SELECT FROM "public".dq_queues AS q WHERE q.queue = dq__paused.queue AND q.paused_at IS NOT NULL
    );
END
$$;

-- The paused queues (dq_pause); none for a caller that may not read the
-- queues' settings (a role granted only SELECT on dq_messages, whose
-- dq_stats worked in 1.1 and still does: dq_stats says NULL there). Read
-- once per dq_stats call (1.2 probed dq_queues once per queue).
CREATE FUNCTION dq__paused_queues() RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF has_table_privilege('"public".dq_queues', 'SELECT') THEN
        RETURN QUERY SELECT q.queue::text FROM "public".dq_queues AS q WHERE q.paused_at IS NOT NULL;
    END IF;
END
$$;

-- One row per queue with messages, or exactly one row for the named queue.
CREATE FUNCTION dq_stats(queue text DEFAULT NULL) RETURNS TABLE (
    queue text,
    ready bigint,
    delayed bigint,
    leased bigint,
    oldest_ready_at timestamptz,
    next_due_at timestamptz,
    paused boolean  -- since 1.2 (dq_pause)
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT "public".dq_now();  -- unused: an invalid dq.now fails every call
    SELECT "public".dq__check_queue(dq_stats.queue) WHERE dq_stats.queue IS NOT NULL;
    SELECT
        s.*,
        -- NULL: the caller may not read the queues' settings (dq__paused_queues)
        CASE WHEN r.may_read THEN p.queue IS NOT NULL END
    FROM (
        -- every queue: from the counts (1.2: one pass over the table)
        SELECT c.*
        FROM "public".dq_now() AS n (now_at)
        CROSS JOIN LATERAL "public".dq__counted_stats(n.now_at) AS c
        WHERE dq_stats.queue IS NULL AND "public".dq__overview_counted(n.now_at)
        UNION ALL
        SELECT c.*
        FROM "public".dq_now() AS n (now_at)
        CROSS JOIN LATERAL "public".dq__scanned_stats(n.now_at) AS c
        WHERE dq_stats.queue IS NULL AND NOT "public".dq__overview_counted(n.now_at)
        UNION ALL
        -- a named queue: its messages only, zeros when it has none (1.2: it read every queue)
        SELECT dq_stats.queue, c.*
        FROM "public".dq__queue_stats(dq_stats.queue) AS c
        WHERE dq_stats.queue IS NOT NULL
    ) AS s
    LEFT JOIN "public".dq__paused_queues() AS p (queue) ON p.queue = s.queue
    CROSS JOIN (SELECT has_table_privilege('"public".dq_queues', 'SELECT') AS may_read) AS r
    ORDER BY 1;
$$;


-- Messages falling due in each of the next hours hours (1 to 168) of queue:
-- hour_start is now plus whole hours; a leased message counts at its lease's
-- end, when it would be delivered again. Two index range scans (the poll
-- indexes), so a dashboard's chart costs the messages of those hours only.
CREATE FUNCTION dq_due_hours(queue text, hours integer DEFAULT 24) RETURNS TABLE (
    hour_start timestamptz,
    due bigint
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT "public".dq_now();  -- unused: an invalid dq.now fails every call
    SELECT "public".dq__check_queue(dq_due_hours.queue);
    SELECT "public".dq__check_between(dq_due_hours.hours, 'hours', 1, 168);
    WITH now_at AS (SELECT "public".dq_now() AS now_at),

    due AS (
        -- the predicates of the two partial poll indexes, spelled as theirs
        SELECT m.due_at
        FROM "public".dq_messages AS m
        CROSS JOIN now_at AS n
        WHERE
            m.queue = dq_due_hours.queue AND m.channel = '' AND m.priority = 0
            AND m.due_at > n.now_at AND m.due_at < n.now_at + make_interval(hours => dq_due_hours.hours)
        UNION ALL
        SELECT m.due_at
        FROM "public".dq_messages AS m
        CROSS JOIN now_at AS n
        WHERE
            m.queue = dq_due_hours.queue AND (m.channel <> '' OR m.priority <> 0)
            AND m.due_at > n.now_at AND m.due_at < n.now_at + make_interval(hours => dq_due_hours.hours)
    ),

    counted AS (
        SELECT date_bin('1 hour', d.due_at, n.now_at) AS hour_start, count(*) AS due
        FROM due AS d
        CROSS JOIN now_at AS n
        GROUP BY 1
    )

    SELECT h.hour_start, coalesce(c.due, 0)
    FROM now_at AS n
    CROSS JOIN LATERAL generate_series(
        n.now_at, n.now_at + make_interval(hours => dq_due_hours.hours - 1), interval '1 hour'
    ) AS h (hour_start)
    LEFT JOIN counted AS c ON h.hour_start = c.hour_start
    ORDER BY h.hour_start;
$$;

-- The queues holding a live message of key, by name: one index probe per
-- queue with messages (a loose scan of (queue, key)), for protocols whose
-- ids name no queue (pgdq serve's POST /command).
CREATE FUNCTION dq_key_queues(key text) RETURNS SETOF text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT "public".dq_now();  -- unused: an invalid dq.now fails every call
    SELECT "public".dq__check_key(dq_key_queues.key, 'key');
    -- the queues with keyed messages: a loose scan of the key index
    WITH RECURSIVE queues (queue) AS (
        (SELECT m.queue FROM "public".dq_messages AS m WHERE m.key IS NOT NULL ORDER BY m.queue LIMIT 1)
        UNION ALL
        SELECT (
            SELECT m.queue FROM "public".dq_messages AS m
            WHERE m.queue > q.queue AND m.key IS NOT NULL
            ORDER BY m.queue LIMIT 1
        )
        FROM queues AS q
        WHERE q.queue IS NOT NULL
    )

    SELECT q.queue::text
    FROM queues AS q
    WHERE EXISTS (
        SELECT FROM "public".dq_messages AS m
        WHERE m.queue = q.queue AND m.key = dq_key_queues.key
    )
    ORDER BY 1;
$$;

-- The earliest due time in queue (leases by their end); NULL when empty
-- or paused.
-- With channels: the earliest time a message could be eligible.
CREATE FUNCTION dq_next_due(queue text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
    v_first timestamptz;
BEGIN
    PERFORM "public".dq__check_queue(dq_next_due.queue);
    -- a paused queue (dq_pause) has nothing due for its consumers
    -- (as far as the caller may read the queues' settings: dq__paused)
    IF "public".dq__paused(dq_next_due.queue) THEN
        RETURN NULL;
    END IF;
    -- a queue with groups (42_groups.sql), else the first entry of the
    -- queue's range in (queue, due_at, id); one statement either way
    v_first := CASE
        WHEN EXISTS (
            SELECT FROM "public".dq_groups AS g
            WHERE g.queue = dq_next_due.queue AND g.channel = ''
        ) THEN "public".dq__grouped_next_due(dq_next_due.queue, v_now, NULL)
        ELSE (
            SELECT m.due_at FROM "public".dq_messages AS m
            WHERE m.queue = dq_next_due.queue AND m.channel = '' AND m.priority = 0
            ORDER BY m.due_at
            LIMIT 1
        )
    END;
    -- or the next occurrence of one of its schedules if that comes first
    RETURN least(
        v_first,
        (
            SELECT s.next_at FROM "public".dq_schedules AS s
            WHERE s.queue = dq_next_due.queue AND s.next_at < 'infinity'
            ORDER BY s.next_at
            LIMIT 1
        )
    );
END
$$;

-- Pause queue: polls lease nothing from it until dq_resume; true when it
-- was not paused.
CREATE FUNCTION dq_pause(queue text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
BEGIN
    PERFORM "public".dq__check_queue(dq_pause.queue);
    -- a queue already paused keeps its row as it is: no row comes back
    INSERT INTO "public".dq_queues AS q (queue, paused_at)
    VALUES (dq_pause.queue, v_now)
    ON CONFLICT (queue) DO UPDATE SET paused_at = excluded.paused_at
    WHERE q.paused_at IS NULL;
    RETURN FOUND;
END
$$;

-- Resume a paused queue, waking its idle consumers when it holds a
-- message; true when it was paused.
CREATE FUNCTION dq_resume(queue text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := "public".dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM "public".dq__check_queue(dq_resume.queue);
    UPDATE "public".dq_queues AS q SET paused_at = NULL
    WHERE q.queue = dq_resume.queue AND q.paused_at IS NOT NULL;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    -- one probe of each poll index
    IF EXISTS (
        SELECT FROM "public".dq_messages AS m
        WHERE m.queue = dq_resume.queue AND m.channel = '' AND m.priority = 0
    ) OR EXISTS (
        SELECT FROM "public".dq_messages AS m
        WHERE m.queue = dq_resume.queue AND (m.channel <> '' OR m.priority <> 0)
    ) THEN
        PERFORM "public".dq__wake(dq_resume.queue);
    END IF;
    RETURN TRUE;
END
$$;

-- Channels (since 1.1): set and drop a channel's limits, list a queue's
-- channels. How polls apply the limits: 42_groups.sql.

-- Set the limits of one channel of queue, replacing earlier ones (NULL: no
-- limit; a min_interval of 0 is none).
CREATE FUNCTION dq_channel_set(
    queue text,
    channel text,
    max_concurrency integer DEFAULT NULL,
    min_interval interval DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
BEGIN
    PERFORM "public".dq__check_queue(dq_channel_set.queue);
    PERFORM "public".dq__null_check(dq_channel_set.channel IS NULL, 'channel');
    PERFORM "public".dq__check_channel(dq_channel_set.channel, 'channel');
    IF dq_channel_set.max_concurrency < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('pgdq: max_concurrency must be at least 1 or NULL, got %s', dq_channel_set.max_concurrency);
    END IF;
    IF dq_channel_set.min_interval < '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('pgdq: min_interval must not be negative, got %s', dq_channel_set.min_interval);
    END IF;
    -- the unchanneled group's row marks the queue as one with channels; a
    -- channel without messages has no next due time (offers lower it)
    INSERT INTO "public".dq_groups AS g (queue, channel, max_concurrency, min_interval, first_due)
    VALUES
        (dq_channel_set.queue, '', NULL, NULL, v_now),
        (
            dq_channel_set.queue, dq_channel_set.channel, dq_channel_set.max_concurrency,
            nullif(dq_channel_set.min_interval, '0'), "public".dq__never()
        )
    ON CONFLICT ON CONSTRAINT dq_groups_pkey DO UPDATE
        SET max_concurrency = excluded.max_concurrency,
            min_interval = excluded.min_interval,
            wake_at = NULL  -- looser limits may let a message go now
        WHERE g.channel <> '';
    PERFORM "public".dq__wake(dq_channel_set.queue);
END
$$;

-- Drop the limits of one channel of queue (its messages stay); true if it had any.
CREATE FUNCTION dq_channel_remove(queue text, channel text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := "public".dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM "public".dq__check_queue(dq_channel_remove.queue);
    PERFORM "public".dq__null_check(dq_channel_remove.channel IS NULL, 'channel');
    PERFORM "public".dq__check_channel(dq_channel_remove.channel, 'channel');
    -- the row stays while the channel has messages (polls forget it after)
    UPDATE "public".dq_groups AS g
    SET max_concurrency = NULL, min_interval = NULL, wake_at = NULL
    WHERE g.queue = dq_channel_remove.queue AND g.channel = dq_channel_remove.channel
        AND (g.max_concurrency IS NOT NULL OR g.min_interval IS NOT NULL);
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    PERFORM "public".dq__wake(dq_channel_remove.queue);
    RETURN TRUE;
END
$$;

-- One row per channel of queue that has messages or limits, by name: its
-- limits, its messages by condition (as dq_stats counts them: a due message
-- held back by a limit is ready) and when it last leased one.
CREATE FUNCTION dq_channels(queue text) RETURNS TABLE (
    channel text,
    max_concurrency integer,
    min_interval interval,
    ready bigint,
    delayed bigint,
    leased bigint,
    last_leased_at timestamptz
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT "public".dq_now();  -- unused: an invalid dq.now fails every call
    SELECT "public".dq__check_queue(dq_channels.queue);
    WITH counted AS (
        SELECT
            m.channel,
            count(*) FILTER (WHERE m.due_at <= n.now_at) AS ready,
            count(*) FILTER (WHERE m.due_at > n.now_at AND m.lock_token IS NULL) AS delayed,
            count(*) FILTER (
                WHERE "public".dq__is_leased(m.lock_token, m.due_at, n.now_at)
            ) AS leased
        FROM "public".dq_messages AS m
        CROSS JOIN "public".dq_now() AS n (now_at)
        WHERE m.queue = dq_channels.queue AND m.channel <> ''
        GROUP BY m.channel
    ),

    limited AS (
        SELECT g.channel, g.max_concurrency, g.min_interval, g.last_leased_at
        FROM "public".dq_groups AS g
        WHERE g.queue = dq_channels.queue AND g.channel <> ''
    )

    SELECT
        coalesce(c.channel, l.channel)::text,
        l.max_concurrency,
        l.min_interval,
        coalesce(c.ready, 0),
        coalesce(c.delayed, 0),
        coalesce(c.leased, 0),
        l.last_leased_at
    FROM counted AS c
    FULL JOIN limited AS l ON c.channel = l.channel
    WHERE c.channel IS NOT NULL OR l.max_concurrency IS NOT NULL OR l.min_interval IS NOT NULL
    ORDER BY 1;
$$;

-- Snapshot reads (additions to version 1 of the SQL API): the messages or
-- dead letters of a queue, or of every queue, in id ranges, so that several
-- readers can split a table between them and read it in one snapshot
-- (pg_export_snapshot; python/pgdq/spark.py). They lock and change nothing
-- and never return lock tokens. Bounds: from_id <= id < to_id, NULL
-- unbounded; written `id <= coalesce(to_id, max) AND id IS DISTINCT FROM
-- to_id` so that a generic plan still ranges over an index on id.
-- The two range reads use that generic plan on every server
-- (plan_cache_mode): PostgreSQL 18 would otherwise plan their statements
-- anew for each call's values (15 to 17 plan a SQL function's statements
-- with parameters), reading the index's ends to estimate the range: on
-- 18.6, 17 pages for 100 ids instead of 7.

-- The messages of queue (NULL: every queue) with from_id <= id < to_id, by id.
CREATE FUNCTION dq_read_messages(queue text, from_id bigint, to_id bigint) RETURNS TABLE (
    id bigint,
    queue text,
    key text,
    payload jsonb,
    state jsonb,
    scheduled_at timestamptz,
    due_at timestamptz,
    created_at timestamptz,
    attempts integer,
    leased boolean
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see the head of this file
AS $$
    SELECT "public".dq_now();  -- unused: an invalid dq.now fails every call
    SELECT "public".dq__check_queue(dq_read_messages.queue) WHERE dq_read_messages.queue IS NOT NULL;
    SELECT
        m.id, m.queue::text, m.key::text, m.payload, m.state, m.scheduled_at, m.due_at, m.created_at,
        m.attempts, "public".dq__is_leased(m.lock_token, m.due_at, n.now_at)
    FROM "public".dq_messages AS m
    CROSS JOIN "public".dq_now() AS n (now_at)
    WHERE (dq_read_messages.queue IS NULL OR m.queue = dq_read_messages.queue)
        AND m.id >= coalesce(dq_read_messages.from_id, -9223372036854775808)
        AND m.id <= coalesce(dq_read_messages.to_id, 9223372036854775807)
        AND m.id IS DISTINCT FROM dq_read_messages.to_id
    ORDER BY m.id;
$$;

-- The dead letters of queue (NULL: every queue) with from_id <= id < to_id
-- (id: the message's id when it failed), by id.
CREATE FUNCTION dq_read_dead_letters(queue text, from_id bigint, to_id bigint) RETURNS TABLE (
    id bigint,
    queue text,
    key text,
    payload jsonb,
    state jsonb,
    scheduled_at timestamptz,
    created_at timestamptz,
    attempts integer,
    error text,
    failed_at timestamptz
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see the head of this file
AS $$
    SELECT "public".dq_now();  -- unused: an invalid dq.now fails every call
    SELECT "public".dq__check_queue(dq_read_dead_letters.queue) WHERE dq_read_dead_letters.queue IS NOT NULL;
    SELECT
        d.id, d.queue::text, d.key::text, d.payload, d.state, d.scheduled_at, d.created_at,
        d.attempts, d.error, d.failed_at
    FROM "public".dq_dead_letters AS d
    WHERE (dq_read_dead_letters.queue IS NULL OR d.queue = dq_read_dead_letters.queue)
        AND d.id >= coalesce(dq_read_dead_letters.from_id, -9223372036854775808)
        AND d.id <= coalesce(dq_read_dead_letters.to_id, 9223372036854775807)
        AND d.id IS DISTINCT FROM dq_read_dead_letters.to_id
    ORDER BY d.id;
$$;

-- The lowest and highest id (NULL, NULL when there are none) of source,
-- 'messages' or 'dead_letters', in queue (NULL: every queue). For every
-- queue it reads the two ends of an index on id; for one, that queue's rows.
CREATE FUNCTION dq_read_bounds(source text, queue text) RETURNS TABLE (low bigint, high bigint)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := "public".dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM "public".dq__null_check(dq_read_bounds.source IS NULL, 'source');
    PERFORM "public".dq__check_one_of(dq_read_bounds.source, 'source', ARRAY['messages', 'dead_letters']);
    IF dq_read_bounds.queue IS NOT NULL THEN
        PERFORM "public".dq__check_queue(dq_read_bounds.queue);
    END IF;
    -- one statement per case, so each keeps its own plan
    IF dq_read_bounds.source = 'messages' AND dq_read_bounds.queue IS NULL THEN
        RETURN QUERY SELECT min(m.id), max(m.id) FROM "public".dq_messages AS m;
    ELSIF dq_read_bounds.source = 'messages' THEN
        RETURN QUERY SELECT min(m.id), max(m.id) FROM "public".dq_messages AS m
        WHERE m.queue = dq_read_bounds.queue AND "public".dq__in_poll_indexes(m.channel, m.priority);
    ELSIF dq_read_bounds.queue IS NULL THEN
        RETURN QUERY SELECT min(d.id), max(d.id) FROM "public".dq_dead_letters AS d;
    ELSE
        RETURN QUERY SELECT min(d.id), max(d.id) FROM "public".dq_dead_letters AS d
        WHERE d.queue = dq_read_bounds.queue;
    END IF;
END
$$;

-- History (1.2): a record of each message that leaves a queue with
-- retention on (dq_retain), kept for the queue's period, and tallies of the
-- records by second and by minute behind dq_history_stats.
--
-- Records are written by the trigger that counts deleted messages
-- (12_counts.sql: dq__count_rows), from its transition table, when the
-- deleting function names an outcome: dq_ack and dq_ack_many SET dq.outcome
-- = 'acked', dq__bury 'dead', dq_cancel and dq_cancel_id 'cancelled', dq_purge
-- 'purged', dq_finish and dq_finish_id 'acked' (1.3, through dq__cancel).
-- Other deletes (cron uninstalls, schedule removals, a redrive's withdrawals, a user's DELETE) name none and leave no
-- record. A queue without retention costs that trigger one probe of
-- dq_queues per deleting statement and nothing else; no poll, offer or
-- lease reads anything here.
--
-- History belongs to its queue (1.3). The trigger runs as pgdq's owner, so
-- nothing a caller sets may reach beyond the messages the caller deleted:
-- the records and tallies are stamped by the history clock
-- (dq__history_now: the session's dq.now, never ahead of the server's), and
-- a statement expires records only of the queues whose messages it deleted.
-- A role that may DELETE from dq_messages may label its own deletes (SET
-- dq.outcome) or leave them unrecorded, as docs/security.md says; records
-- already written, and other queues', are out of its reach.
--
-- No row is ever updated, so no row is a hot spot: each recording statement
-- appends its records and one delta row per (queue, second, measure, bin)
-- to dq_history_deltas (no index: a few hundred rows). Now and then (one
-- recording statement in 256) a writer folds the deltas it can lock into
-- per-second and per-minute sums in dq_history_tallies, merging the sums of
-- those seconds and minutes that earlier folds left, skipping rows another
-- folder holds (dq__fold_history). Readers sum tallies and deltas.
--
-- Records expire without a process of the user's: a statement that
-- recorded n records expires, with probability n / 512, up to
-- max(1024, 2 n) expired records of its own queues, oldest first, and as
-- many of their tallies (dq__expire_history), skipping rows another expiry
-- holds. So expiry outpaces recording twofold on average, no statement does
-- more than a bounded multiple of its own work (about 5 ms for 1,024
-- records), and with the autovacuum settings below the space of expired
-- rows is reused: under steady traffic the table's size stays flat
-- (bench/RESULTS.md measures it). Readers never see a record older than the
-- period, deleted or not.

CREATE TABLE dq_history (
    queue text COLLATE "C" NOT NULL,
    key text COLLATE "C",       -- NULL: a keyless message
    id bigint NOT NULL,         -- the message's id
    outcome text NOT NULL CONSTRAINT dq_history_outcome
    CHECK (outcome IN ('acked', 'dead', 'cancelled', 'purged')),
    payload jsonb NOT NULL,
    state jsonb,
    channel text COLLATE "C" NOT NULL,  -- '' for none, as in dq_messages
    priority integer NOT NULL,
    created_at timestamptz NOT NULL,
    scheduled_at timestamptz NOT NULL,
    last_leased_at timestamptz,  -- NULL: never delivered
    finished_at timestamptz NOT NULL,
    attempts integer NOT NULL,
    last_error text,
    headers jsonb,
    -- last_leased_at minus the due time that delivery was made at
    lateness interval
) WITH (
    -- expiry deletes the oldest records as new ones arrive: vacuum after
    -- 2% of the table is dead, unthrottled, so that their space is reused
    -- before the table grows
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);

-- A queue's records by finish: dq_history, and expiry (oldest first). No
-- id: a statement's records share their finish, so its entries are
-- duplicates that the index stores as one (ties are few and sorted).
CREATE INDEX dq_history_finished ON dq_history (queue, finished_at);

-- A key's records by finish: dq_history with a key.
CREATE INDEX dq_history_key ON dq_history (queue, key, finished_at, id)
WHERE key IS NOT NULL;

COMMENT ON TABLE dq_history IS
'pgdq message history (dq_retain). Written by triggers on dq_messages; use dq_history.';

-- The tallies of one recording statement, not yet folded: per queue and
-- second of finish, for each measure ('a' acked, 'd' dead, 'c' cancelled:
-- bin 0; 'l' lateness and 'r' run time of acked and dead records: their
-- dq__duration_bin) the number of records. ("char", quoted: the one-byte
-- type, not char(1).)
CREATE TABLE dq_history_deltas (
    queue text COLLATE "C" NOT NULL,
    at timestamptz NOT NULL,  -- the second
    measure "char" NOT NULL,  -- noqa: RF06
    bin smallint NOT NULL,
    n bigint NOT NULL
) WITH (
    -- every fold leaves the rows it took dead: vacuum them soon, so that
    -- the table that readers and folds scan whole stays a few pages
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);

COMMENT ON TABLE dq_history_deltas IS
'pgdq history tallies not yet folded. Written by triggers on dq_messages; internal.';

-- Folded tallies: as dq_history_deltas, summed per second (width 1) and per
-- minute (width 60). A second or minute may have a few rows (folds that
-- ran at once); readers sum them.
CREATE TABLE dq_history_tallies (
    queue text COLLATE "C" NOT NULL,
    width smallint NOT NULL,  -- seconds
    at timestamptz NOT NULL,  -- the start of the second or minute
    measure "char" NOT NULL,  -- noqa: RF06
    bin smallint NOT NULL,
    n bigint NOT NULL
) WITH (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);

CREATE INDEX dq_history_tallies_at ON dq_history_tallies (queue, width, at);

COMMENT ON TABLE dq_history_tallies IS
'pgdq history tallies by second and minute. Written by triggers on dq_messages; use dq_history_stats.';

-- Who reads the history: roles granted SELECT that row-level security does
-- not isolate (as dq_counts, 12_counts.sql): a role under policies on
-- dq_messages sees no other tenant's records, and so none.
ALTER TABLE dq_history ENABLE ROW LEVEL SECURITY;
CREATE POLICY dq_history_unless_isolated ON dq_history
USING ((SELECT NOT pg_catalog.row_security_active('"public".dq_messages'::regclass)));
ALTER TABLE dq_history_deltas ENABLE ROW LEVEL SECURITY;
CREATE POLICY dq_history_deltas_unless_isolated ON dq_history_deltas
USING ((SELECT NOT pg_catalog.row_security_active('"public".dq_messages'::regclass)));
ALTER TABLE dq_history_tallies ENABLE ROW LEVEL SECURITY;
CREATE POLICY dq_history_tallies_unless_isolated ON dq_history_tallies
USING ((SELECT NOT pg_catalog.row_security_active('"public".dq_messages'::regclass)));

-- The histogram bin of a duration: 0 below 1 ms, else b >= 1 holding
-- [1.1^(b-1), 1.1^b) ms, so that a bin's middle (dq__bin_duration) is
-- within 5 % of every duration in it. NULL for NULL.
CREATE FUNCTION dq__duration_bin(d interval) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN d IS NULL THEN NULL
        WHEN pg_catalog.date_part('epoch', d) OPERATOR(pg_catalog.<) 0.001 THEN 0
        ELSE (1 OPERATOR(pg_catalog.+) pg_catalog.floor(
            pg_catalog.ln(pg_catalog.date_part('epoch', d) OPERATOR(pg_catalog.*) 1000)
            OPERATOR(pg_catalog./) pg_catalog.ln(1.1::double precision)
        ))::smallint
    END
$$;

-- The duration a histogram bin stands for: its geometric middle (bin 0:
-- half a millisecond).
CREATE FUNCTION dq__bin_duration(bin smallint) RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN bin OPERATOR(pg_catalog.=) 0 THEN interval '0.5 milliseconds'
        ELSE pg_catalog.make_interval(secs => 1.1::double precision
            OPERATOR(pg_catalog.^) (bin OPERATOR(pg_catalog.-) 0.5) OPERATOR(pg_catalog./) 1000)
    END
$$;

-- Fold the history deltas this transaction can lock into per-second and
-- per-minute tallies, merged with the tallies of the same seconds and
-- minutes it can lock. Never waits: rows another fold holds are left.
CREATE FUNCTION dq__fold_history() RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off  -- see 12_counts.sql (dq__fold_counts)
AS $$
    WITH taken AS (
        DELETE FROM "public".dq_history_deltas AS d
        WHERE d.ctid = ANY (ARRAY(SELECT l.ctid FROM "public".dq_history_deltas AS l FOR UPDATE SKIP LOCKED))
        RETURNING d.queue, d.at, d.measure, d.bin, d.n
    ),
    summed AS (
        SELECT t.queue, w.width, pg_catalog.date_bin(pg_catalog.make_interval(secs => w.width), t.at, 'epoch') AS at,
            t.measure, t.bin, t.n
        FROM taken AS t
        CROSS JOIN (VALUES (1::smallint), (60::smallint)) AS w (width)
    ),
    spans AS (
        SELECT DISTINCT s.queue, s.width, s.at FROM summed AS s
    ),
    merged AS (
        DELETE FROM "public".dq_history_tallies AS y
        WHERE y.ctid = ANY (ARRAY(
            SELECT t.ctid
            FROM "public".dq_history_tallies AS t
            INNER JOIN spans AS p ON t.queue = p.queue AND t.width = p.width AND t.at = p.at
            FOR UPDATE OF t SKIP LOCKED
        ))
        RETURNING y.queue, y.width, y.at, y.measure, y.bin, y.n
    )
    INSERT INTO "public".dq_history_tallies (queue, width, at, measure, bin, n)
    SELECT a.queue, a.width, a.at, a.measure, a.bin, sum(a.n)
    FROM (
        SELECT s.queue, s.width, s.at, s.measure, s.bin, s.n FROM summed AS s
        UNION ALL
        SELECT m.queue, m.width, m.at, m.measure, m.bin, m.n FROM merged AS m
    ) AS a
    GROUP BY 1, 2, 3, 4, 5;
$$;

-- The finish before which a queue's records have aged out at now_at: its
-- period back from now, or its history_from when that is later.
CREATE FUNCTION dq__history_cut(keep interval, history_from timestamptz, now_at timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT pg_catalog.timestamptz_larger(now_at OPERATOR(pg_catalog.-) keep, coalesce(history_from, '-infinity'))
$$;

-- The history's clock: the session's dq_now(), but never ahead of the
-- server's. Records are stamped and expired by it, so a session's dq.now
-- can pin it to the past (tests) but can neither date a record ahead of the
-- server nor age out a record early.
CREATE FUNCTION dq__history_now() RETURNS timestamptz
LANGUAGE sql VOLATILE
AS $$
    SELECT pg_catalog.timestamptz_smaller("public".dq_now(), pg_catalog.clock_timestamp())
$$;

-- Delete up to max_rows records older than their queue's period (and up to
-- as many tallies), of queues only, oldest first, by the history clock;
-- rows another expiry holds are left. Never waits.
CREATE FUNCTION dq__expire_history(queues text[], max_rows integer) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    v_now timestamptz := "public".dq__history_now();
    v_queue record;
    v_left integer := max_rows;
    v_tallies_left integer := max_rows;
    v_deleted integer;
BEGIN
    FOR v_queue IN
        SELECT q.queue, "public".dq__history_cut(q.history_keep, q.history_from, v_now) AS cut
        FROM "public".dq_queues AS q
        WHERE q.queue = ANY (dq__expire_history.queues) AND q.history_keep IS NOT NULL
        ORDER BY q.queue
    LOOP
        EXIT WHEN v_left <= 0 AND v_tallies_left <= 0;
        DELETE FROM "public".dq_history AS h
        WHERE h.ctid = ANY (ARRAY(
            SELECT o.ctid FROM "public".dq_history AS o
            WHERE o.queue = v_queue.queue AND o.finished_at < v_queue.cut
            ORDER BY o.finished_at
            LIMIT greatest(v_left, 0)
            FOR UPDATE SKIP LOCKED
        ));
        GET DIAGNOSTICS v_deleted = ROW_COUNT;
        v_left := v_left - v_deleted;
        DELETE FROM "public".dq_history_tallies AS y
        WHERE y.ctid = ANY (ARRAY(
            SELECT o.ctid FROM "public".dq_history_tallies AS o
            WHERE o.queue = v_queue.queue AND o.width IN (1, 60)
                AND o.at < v_queue.cut - interval '1 minute'
            LIMIT greatest(v_tallies_left, 0)
            FOR UPDATE SKIP LOCKED
        ));
        GET DIAGNOSTICS v_deleted = ROW_COUNT;
        v_tallies_left := v_tallies_left - v_deleted;
    END LOOP;
END
$$;

-- Whether an interval has a negative part (months, days or time): a
-- length such as '1 mon -29 days' that is no period.
CREATE FUNCTION dq__has_negative_part(i interval) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p.months < 0 OR p.days < 0
        OR i - make_interval(months => p.months::integer, days => p.days::integer) < interval '0'
    FROM (SELECT date_part('year', i) * 12 + date_part('month', i) AS months, date_part('day', i) AS days) AS p
$$;

-- Keep a record of each message of queue that leaves it from now on, for
-- keep (NULL: stop; records already kept age out as before). A new period
-- applies to the records kept, but never brings back one that aged out.
CREATE FUNCTION dq_retain(queue text, keep interval) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq__history_now();
BEGIN
    PERFORM "public".dq__check_queue(dq_retain.queue);
    -- a period: no part negative ('1 mon -29 days' is 22023), the whole
    -- longer than zero
    IF keep <= interval '0' OR keep > interval '3650 days' OR "public".dq__has_negative_part(keep) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format('pgdq: keep must be positive and at most 3650 days, or NULL, got %s', keep);
    END IF;
    INSERT INTO "public".dq_queues AS q (queue, retain, history_keep)
    VALUES (dq_retain.queue, keep, keep)
    ON CONFLICT (queue) DO UPDATE
        SET retain = excluded.retain,
            history_keep = coalesce(excluded.history_keep, q.history_keep),
            history_from = CASE
                WHEN q.history_keep IS NOT NULL THEN "public".dq__history_cut(q.history_keep, q.history_from, v_now)
            END;
END
$$;

-- queue's records (with key: that key's), newest finish first, ties by id
-- descending; at most max_count.
CREATE FUNCTION dq_history(queue text, key text DEFAULT NULL, max_count integer DEFAULT 100)
RETURNS TABLE (
    queue text,
    key text,
    id bigint,
    outcome text,
    payload jsonb,
    state jsonb,
    channel text,
    priority integer,
    created_at timestamptz,
    scheduled_at timestamptz,
    last_leased_at timestamptz,
    finished_at timestamptz,
    attempts integer,
    last_error text,
    headers jsonb
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT "public".dq_now();  -- unused: an invalid dq.now fails every call
    SELECT "public".dq__check_queue(dq_history.queue);
    SELECT "public".dq__check_key(dq_history.key, 'key') WHERE dq_history.key IS NOT NULL;
    SELECT "public".dq__null_check(dq_history.max_count IS NULL, 'max_count');
    SELECT
        h.queue::text, h.key::text, h.id, h.outcome, h.payload, h.state, nullif(h.channel, '')::text,
        h.priority, h.created_at, h.scheduled_at, h.last_leased_at, h.finished_at, h.attempts,
        h.last_error, h.headers
    FROM "public".dq_queues AS q
    CROSS JOIN "public".dq_now() AS n (now_at)
    CROSS JOIN LATERAL (
        (
            SELECT a.* FROM "public".dq_history AS a
            WHERE dq_history.key IS NULL AND a.queue = q.queue
                AND a.finished_at >= "public".dq__history_cut(q.history_keep, q.history_from, n.now_at)
            ORDER BY a.finished_at DESC, a.id DESC
            LIMIT greatest(dq_history.max_count, 0)
        )
        UNION ALL
        (
            SELECT k.* FROM "public".dq_history AS k
            WHERE dq_history.key IS NOT NULL AND k.queue = q.queue AND k.key = dq_history.key
                AND k.finished_at >= "public".dq__history_cut(q.history_keep, q.history_from, n.now_at)
            ORDER BY k.finished_at DESC, k.id DESC
            LIMIT greatest(dq_history.max_count, 0)
        )
    ) AS h
    WHERE q.queue = dq_history.queue AND q.history_keep IS NOT NULL
    ORDER BY h.finished_at DESC, h.id DESC;
$$;

-- queue's records counted per bucket of bucket (whole seconds, 1 second
-- to 1 day), from the bucket holding since to now, oldest first: buckets
-- with a record only. From the minute tallies when bucket is whole
-- minutes, else from the second tallies: the work is bounded by the
-- buckets, never by the records (1.3; a fraction of a second read the
-- records).
CREATE FUNCTION dq_history_stats(queue text, since timestamptz, bucket interval)
RETURNS TABLE (
    bucket_at timestamptz,
    acked bigint,
    dead bigint,
    cancelled bigint,
    lateness_p50 interval,
    lateness_p99 interval,
    run_p50 interval,
    run_p99 interval
)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
-- one plan for every call (1.3): planning the statement below anew took more
-- than running it for a queue with few records (0.5 ms instead of 2.9 ms)
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
    v_seconds numeric;
    v_width smallint;
    v_from timestamptz;
    v_buckets numeric;
    v_cut timestamptz;       -- records finished before it have aged out
    v_cut_second timestamptz;  -- the first whole second after it (or it)
    v_cut_width timestamptz;   -- the first whole tally after it (or it)
BEGIN
    PERFORM "public".dq__check_queue(dq_history_stats.queue);
    PERFORM "public".dq__null_check(since IS NULL, 'since');
    PERFORM "public".dq__null_check(bucket IS NULL, 'bucket');
    PERFORM "public".dq__check_time(since, 'since');
    v_seconds := pg_catalog.date_part('epoch', bucket)::numeric;
    -- (no months or years: a bucket is a fixed length; date_bin refuses them)
    IF bucket < interval '1 second' OR bucket > interval '1 day'
        OR pg_catalog.date_part('month', bucket) <> 0 OR pg_catalog.date_part('year', bucket) <> 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format('pgdq: bucket must be from 1 second to 1 day, got %s', bucket);
    END IF;
    IF v_seconds % 1 <> 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format('pgdq: bucket must be whole seconds, got %s', bucket);
    END IF;
    v_from := pg_catalog.date_bin(bucket, since, 'epoch');
    -- the buckets from the one holding since to the one holding now
    v_buckets := pg_catalog.floor(
        (pg_catalog.date_part('epoch', v_now) - pg_catalog.date_part('epoch', v_from)) / v_seconds
    ) + 1;
    IF v_buckets > 10000 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format(
                'pgdq: since and bucket must span at most 10000 buckets up to now, got %s buckets of %s', v_buckets, bucket
            );
    END IF;
    v_cut := (
        SELECT "public".dq__history_cut(q.history_keep, q.history_from, v_now)
        FROM "public".dq_queues AS q
        WHERE q.queue = dq_history_stats.queue
    );
    IF v_cut IS NULL THEN  -- the queue never kept history
        RETURN;
    END IF;
    v_width := CASE WHEN v_seconds % 60 = 0 THEN 60 ELSE 1 END;
    -- what has not aged out: whole tallies after the cut, the seconds
    -- between the cut and the first whole tally, and the records between
    -- the cut and the first whole second
    v_cut_second := pg_catalog.date_bin('1 second', v_cut - interval '1 microsecond', 'epoch') + interval '1 second';
    v_cut_width := pg_catalog.date_bin(
        make_interval(secs => v_width), v_cut - interval '1 microsecond', 'epoch'
    ) + make_interval(secs => v_width);

    RETURN QUERY
    WITH counted AS (
        -- folded tallies of the period
        SELECT pg_catalog.date_bin(bucket, t.at, 'epoch') AS b, t.measure, t.bin, t.n
        FROM "public".dq_history_tallies AS t
        WHERE t.queue = dq_history_stats.queue AND t.width = v_width
            AND t.at >= v_from AND t.at >= v_cut_width
        UNION ALL
        -- the seconds before the first whole minute after the cut
        SELECT pg_catalog.date_bin(bucket, t.at, 'epoch') AS b, t.measure, t.bin, t.n
        FROM "public".dq_history_tallies AS t
        WHERE v_width = 60 AND t.queue = dq_history_stats.queue AND t.width = 1
            AND t.at >= v_from AND t.at >= v_cut_second AND t.at < v_cut_width
        UNION ALL
        -- and the deltas not yet folded
        SELECT pg_catalog.date_bin(bucket, d.at, 'epoch'), d.measure, d.bin, d.n
        FROM "public".dq_history_deltas AS d
        WHERE d.queue = dq_history_stats.queue AND d.at >= v_from
            AND d.at >= v_cut_second
        UNION ALL
        -- the records themselves between the cut and the first whole
        -- second after it
        SELECT pg_catalog.date_bin(bucket, r.finished_at, 'epoch'), m.measure,
            CASE m.measure
                WHEN 'l' THEN "public".dq__duration_bin(r.lateness)
                WHEN 'r' THEN "public".dq__duration_bin(r.finished_at - r.last_leased_at)
                ELSE 0::smallint
            END,
            1::bigint
        FROM "public".dq_history AS r
        CROSS JOIN LATERAL "public".dq__history_measures(r.outcome, r.last_leased_at) AS m (measure)
        WHERE r.queue = dq_history_stats.queue AND r.finished_at >= v_from AND r.finished_at >= v_cut
            AND r.finished_at < v_cut_second
    ),
    binned AS (
        SELECT c.b, c.measure, c.bin, sum(c.n)::bigint AS n
        FROM counted AS c
        GROUP BY 1, 2, 3
    ),
    buckets AS (
        SELECT
            x.b,
            coalesce(sum(x.n) FILTER (WHERE x.measure = 'a'), 0)::bigint AS acked,
            coalesce(sum(x.n) FILTER (WHERE x.measure = 'd'), 0)::bigint AS dead,
            coalesce(sum(x.n) FILTER (WHERE x.measure = 'c'), 0)::bigint AS cancelled
        FROM binned AS x
        WHERE x.b <= v_now
        GROUP BY x.b
        HAVING sum(x.n) FILTER (WHERE x.measure IN ('a', 'd', 'c', 'p')) > 0
    ),
    -- the percentiles of each bucket's lateness and run time, as
    -- percentile_cont computes them from the durations themselves: the
    -- durations at the two ranks around p * (total - 1), interpolated, each
    -- the middle of its bin (so within 5 % or 1 ms of the exact one: an
    -- interpolation keeps its ends' relative error). In one pass over every
    -- bucket (1.3: a function called per bucket took 10 s for 10,000
    -- buckets). Each bin with the ranks it holds, [below, running) counting
    -- from 0:
    ranked AS (
        SELECT x.b, x.measure, x.bin,
            sum(x.n) OVER (PARTITION BY x.b, x.measure ORDER BY x.bin) AS running,
            sum(x.n) OVER (PARTITION BY x.b, x.measure) AS total
        FROM binned AS x
        WHERE x.measure IN ('l', 'r') AND x.b <= v_now
    ),
    -- the bins holding the two ranks around p * (total - 1)
    picked AS (
        SELECT r.b, r.measure, p.p, p.p * (r.total - 1) AS at,
            min(r.bin) FILTER (WHERE r.running > pg_catalog.floor(p.p * (r.total - 1))) AS low,
            min(r.bin) FILTER (WHERE r.running > pg_catalog.ceil(p.p * (r.total - 1))) AS high
        FROM ranked AS r
        CROSS JOIN (VALUES (0.5::double precision), (0.99::double precision)) AS p (p)
        WHERE r.total > 0
        GROUP BY r.b, r.measure, p.p, r.total
    ),
    -- the middle of each bin picked, once a bin (not once a bucket)
    middles AS (
        SELECT u.bin, "public".dq__bin_duration(u.bin) AS middle
        FROM (SELECT k.low FROM picked AS k UNION SELECT k.high FROM picked AS k) AS u (bin)
    ),
    -- each percentile, interpolated between its two bins' middles, per bucket
    percentiles AS (
        SELECT e.b,
            min(e.value) FILTER (WHERE e.measure = 'l' AND e.p = 0.5) AS l50,
            min(e.value) FILTER (WHERE e.measure = 'l' AND e.p = 0.99) AS l99,
            min(e.value) FILTER (WHERE e.measure = 'r' AND e.p = 0.5) AS r50,
            min(e.value) FILTER (WHERE e.measure = 'r' AND e.p = 0.99) AS r99
        FROM (
            SELECT k.b, k.measure, k.p,
                low.middle * (1 - (k.at - pg_catalog.floor(k.at))) + high.middle * (k.at - pg_catalog.floor(k.at)) AS value
            FROM picked AS k
            INNER JOIN middles AS low ON low.bin = k.low
            INNER JOIN middles AS high ON high.bin = k.high
        ) AS e
        GROUP BY e.b
    )
    SELECT y.b, y.acked, y.dead, y.cancelled, e.l50, e.l99, e.r50, e.r99
    FROM buckets AS y
    LEFT JOIN percentiles AS e ON e.b = y.b
    ORDER BY y.b;
END
$$;

-- queue's lateness and run-time histograms per whole minute, from the
-- minute holding since to now, of the records not aged out: per minute,
-- measure ('lateness', 'run') and dq__duration_bin, the records in it.
CREATE FUNCTION dq_history_bins(queue text, since timestamptz)
RETURNS TABLE (minute_at timestamptz, measure text, bin smallint, n bigint)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
SET plan_cache_mode = force_generic_plan  -- as dq_history_stats
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
    v_from timestamptz;
    v_cut timestamptz;         -- records finished before it have aged out
    v_cut_second timestamptz;  -- the first whole second after it (or it)
    v_cut_minute timestamptz;  -- the first whole minute after it (or it)
BEGIN
    PERFORM "public".dq__check_queue(dq_history_bins.queue);
    PERFORM "public".dq__null_check(since IS NULL, 'since');
    PERFORM "public".dq__check_time(since, 'since');
    v_from := pg_catalog.date_bin('1 minute', since, 'epoch');
    v_cut := (
        SELECT "public".dq__history_cut(q.history_keep, q.history_from, v_now)
        FROM "public".dq_queues AS q
        WHERE q.queue = dq_history_bins.queue
    );
    IF v_cut IS NULL THEN  -- the queue never kept history
        RETURN;
    END IF;
    -- as dq_history_stats with 1-minute buckets: whole minute tallies after
    -- the cut, the second tallies before them, the deltas, and the records
    -- between the cut and the first whole second
    v_cut_second := pg_catalog.date_bin('1 second', v_cut - interval '1 microsecond', 'epoch') + interval '1 second';
    v_cut_minute := pg_catalog.date_bin('1 minute', v_cut - interval '1 microsecond', 'epoch') + interval '1 minute';

    RETURN QUERY
    WITH counted AS (
        SELECT t.at AS m, t.measure, t.bin, t.n
        FROM "public".dq_history_tallies AS t
        WHERE t.queue = dq_history_bins.queue AND t.width = 60 AND t.measure IN ('l', 'r')
            AND t.at >= v_from AND t.at >= v_cut_minute
        UNION ALL
        SELECT pg_catalog.date_bin('1 minute', t.at, 'epoch'), t.measure, t.bin, t.n
        FROM "public".dq_history_tallies AS t
        WHERE t.queue = dq_history_bins.queue AND t.width = 1 AND t.measure IN ('l', 'r')
            AND t.at >= v_from AND t.at >= v_cut_second AND t.at < v_cut_minute
        UNION ALL
        SELECT pg_catalog.date_bin('1 minute', d.at, 'epoch'), d.measure, d.bin, d.n
        FROM "public".dq_history_deltas AS d
        WHERE d.queue = dq_history_bins.queue AND d.measure IN ('l', 'r')
            AND d.at >= v_from AND d.at >= v_cut_second
        UNION ALL
        SELECT pg_catalog.date_bin('1 minute', r.finished_at, 'epoch'), m.measure,
            CASE m.measure
                WHEN 'l' THEN "public".dq__duration_bin(r.lateness)
                ELSE "public".dq__duration_bin(r.finished_at - r.last_leased_at)
            END,
            1::bigint
        FROM "public".dq_history AS r
        CROSS JOIN (VALUES ('l'::"char"), ('r'::"char")) AS m (measure)
        WHERE r.queue = dq_history_bins.queue AND r.outcome IN ('acked', 'dead') AND r.last_leased_at IS NOT NULL
            AND r.finished_at >= v_from AND r.finished_at >= v_cut AND r.finished_at < v_cut_second
    )
    SELECT
        c.m,
        CASE c.measure WHEN 'l' THEN 'lateness' ELSE 'run' END,
        c.bin,
        sum(c.n)::bigint
    FROM counted AS c
    WHERE c.m <= v_now
    GROUP BY 1, 2, 3
    ORDER BY 1, 2, 3;
END
$$;

-- dq_history_stats (1-minute buckets, without the percentiles) and
-- dq_history_bins of every queue that keeps history, or of those of
-- queues, in one statement (1.3: /metrics called both for each queue with
-- retention, 1.3 ms a call, 3.5 s for 5,000 queues): from the minute holding
-- since to now, oldest first per queue, a row of outcome counts per minute
-- with a record (measure NULL) and a row per minute, measure ('lateness',
-- 'run') and bin with its records (acked, dead and cancelled NULL).
CREATE FUNCTION dq_history_minutes(since timestamptz, queues text[] DEFAULT NULL)
RETURNS TABLE (
    queue text,
    minute_at timestamptz,
    acked bigint,
    dead bigint,
    cancelled bigint,
    measure text,
    bin smallint,
    n bigint
)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
SET plan_cache_mode = force_generic_plan  -- as dq_history_stats
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
    v_from timestamptz;
    v_minutes numeric;
BEGIN
    PERFORM "public".dq__null_check(since IS NULL, 'since');
    PERFORM "public".dq__check_time(since, 'since');
    v_from := pg_catalog.date_bin('1 minute', since, 'epoch');
    -- as dq_history_stats: at most 10,000 buckets up to now
    v_minutes := pg_catalog.floor((pg_catalog.date_part('epoch', v_now) - pg_catalog.date_part('epoch', v_from)) / 60) + 1;
    IF v_minutes > 10000 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format(
                'pgdq: since must be at most 10000 minutes before now, got %s minutes', v_minutes
            );
    END IF;

    RETURN QUERY
    WITH kept AS (
        -- each queue's cut (records finished before it have aged out), the
        -- first whole second and the first whole minute after it (or it)
        SELECT k.queue, k.cut,
            pg_catalog.date_bin('1 second', k.cut - interval '1 microsecond', 'epoch') + interval '1 second' AS cut_second,
            pg_catalog.date_bin('1 minute', k.cut - interval '1 microsecond', 'epoch') + interval '1 minute' AS cut_minute
        FROM (
            SELECT q.queue, "public".dq__history_cut(q.history_keep, q.history_from, v_now) AS cut
            FROM "public".dq_queues AS q
            WHERE q.history_keep IS NOT NULL
                AND (dq_history_minutes.queues IS NULL OR q.queue = ANY (dq_history_minutes.queues))
        ) AS k
    ),
    -- as dq_history_stats with 1-minute buckets, for every queue kept at once:
    -- whole minute tallies after the cut, the second tallies before them, the
    -- deltas not yet folded (one scan of the table for all queues), and the
    -- records between the cut and the first whole second
    counted AS (
        SELECT k.queue, t.at AS m, t.measure, t.bin, t.n
        FROM kept AS k
        INNER JOIN "public".dq_history_tallies AS t
            ON t.queue = k.queue AND t.width = 60 AND t.at >= v_from AND t.at >= k.cut_minute
        UNION ALL
        SELECT k.queue, pg_catalog.date_bin('1 minute', t.at, 'epoch'), t.measure, t.bin, t.n
        FROM kept AS k
        INNER JOIN "public".dq_history_tallies AS t
            ON t.queue = k.queue AND t.width = 1 AND t.at >= v_from AND t.at >= k.cut_second
                AND t.at < k.cut_minute
        UNION ALL
        SELECT k.queue, pg_catalog.date_bin('1 minute', d.at, 'epoch'), d.measure, d.bin, d.n
        FROM kept AS k
        INNER JOIN "public".dq_history_deltas AS d
            ON d.queue = k.queue AND d.at >= v_from AND d.at >= k.cut_second
        UNION ALL
        SELECT k.queue, pg_catalog.date_bin('1 minute', r.finished_at, 'epoch'), m.measure,
            CASE m.measure
                WHEN 'l' THEN "public".dq__duration_bin(r.lateness)
                WHEN 'r' THEN "public".dq__duration_bin(r.finished_at - r.last_leased_at)
                ELSE 0::smallint
            END,
            1::bigint
        FROM kept AS k
        INNER JOIN "public".dq_history AS r
            ON r.queue = k.queue AND r.finished_at >= v_from AND r.finished_at >= k.cut
                AND r.finished_at < k.cut_second
        CROSS JOIN LATERAL "public".dq__history_measures(r.outcome, r.last_leased_at) AS m (measure)
    ),
    binned AS (
        SELECT c.queue, c.m, c.measure, c.bin, sum(c.n)::bigint AS n
        FROM counted AS c
        WHERE c.m <= v_now
        GROUP BY 1, 2, 3, 4
    )
    SELECT x.queue::text, x.m,
        coalesce(sum(x.n) FILTER (WHERE x.measure = 'a'), 0)::bigint,
        coalesce(sum(x.n) FILTER (WHERE x.measure = 'd'), 0)::bigint,
        coalesce(sum(x.n) FILTER (WHERE x.measure = 'c'), 0)::bigint,
        NULL::text, NULL::smallint, NULL::bigint
    FROM binned AS x
    GROUP BY x.queue, x.m
    HAVING sum(x.n) FILTER (WHERE x.measure IN ('a', 'd', 'c', 'p')) > 0
    UNION ALL
    SELECT x.queue::text, x.m, NULL, NULL, NULL, CASE x.measure WHEN 'l' THEN 'lateness' ELSE 'run' END, x.bin, x.n
    FROM binned AS x
    WHERE x.measure IN ('l', 'r')
    ORDER BY 1, 2, 6, 7;
END
$$;

-- The measures one record counts in: its outcome ('a', 'd', 'c' or 'p'),
-- and for an acked or dead message that was delivered its lateness ('l')
-- and run time ('r').
CREATE FUNCTION dq__history_measures(outcome text, last_leased_at timestamptz) RETURNS SETOF "char"  -- noqa: RF06
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT pg_catalog.left(outcome, 1)::"char"
    UNION ALL
    SELECT m.measure
    FROM (VALUES ('l'::"char"), ('r'::"char")) AS m (measure)
    WHERE outcome OPERATOR(pg_catalog.=) ANY (ARRAY['acked', 'dead'])
        AND last_leased_at IS NOT NULL
$$;

-- Whether a statement's deletes are recorded, and with which outcome: the
-- dq.outcome its function set ('acked', 'dead', 'cancelled', 'purged');
-- NULL for any other delete.
CREATE FUNCTION dq__deleting_outcome() RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT o.outcome
    FROM (SELECT pg_catalog.current_setting('dq.outcome', true) AS outcome) AS o
    WHERE o.outcome OPERATOR(pg_catalog.=) ANY (ARRAY['acked', 'dead', 'cancelled', 'purged'])
$$;

-- What operators look for (1.3, the dashboard's): the messages running now
-- and those waiting to be retried (dq_deliveries), one message's delivery, a stuck lease
-- released without its token, and failures over time for every queue.

-- A live message as dq_deliveries and dq_delivery_of describe it, the
-- columns of both in one place: channel NULL for none, leased_at when its
-- current or last delivery began (NULL: before 1.2, or never delivered),
-- due_at its due time (a running lease's end), last_error whole.
CREATE TYPE dq_delivery_info AS (
    id bigint,
    key text,
    channel text,
    priority integer,
    attempts integer,
    leased_at timestamptz,
    due_at timestamptz,
    last_error text
);

-- Queue's messages in a condition (which: 'running', a lease that still
-- runs, oldest delivery first; 'retrying', tried before (attempts > 0: a
-- nack, or a lease that ended unacked) and not leased now, earliest retry
-- first), up to max_count (1..1000), as dq_delivery_info describes them.
-- What consumers hold now and for how long; what keeps failing. Reads the
-- queue's ranges of both poll indexes (every message of the queue, as
-- dq_stats(queue) does).
CREATE FUNCTION dq_deliveries(
    queue text, which text, max_count integer DEFAULT 100
) RETURNS SETOF dq_delivery_info
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT "public".dq_now();  -- unused: an invalid dq.now fails every call
    SELECT "public".dq__check_queue(dq_deliveries.queue);
    SELECT "public".dq__null_check(dq_deliveries.which IS NULL, 'which');
    SELECT "public".dq__check_one_of(dq_deliveries.which, 'which', ARRAY['running', 'retrying']);
    SELECT "public".dq__check_between(dq_deliveries.max_count, 'max_count', 1, 1000);
    SELECT m.id, m.key::text, nullif(m.channel, '')::text, m.priority, m.attempts, m.leased_at, m.due_at, m.last_error
    FROM "public".dq_messages AS m
    CROSS JOIN "public".dq_now() AS n (now_at)
    WHERE m.queue = dq_deliveries.queue
        AND "public".dq__in_poll_indexes(m.channel, m.priority)
        AND CASE dq_deliveries.which
            WHEN 'running' THEN "public".dq__is_leased(m.lock_token, m.due_at, n.now_at)
            ELSE m.attempts > 0 AND NOT "public".dq__is_leased(m.lock_token, m.due_at, n.now_at)
        END
    ORDER BY
        CASE WHEN dq_deliveries.which = 'running' THEN m.leased_at END NULLS FIRST,
        m.due_at, m.id
    LIMIT dq_deliveries.max_count;
$$;

-- Queue's live message id as dq_deliveries shows one (any condition): its
-- attempts, last delivery and last error; no row when there is none.
CREATE FUNCTION dq_delivery_of(queue text, id bigint) RETURNS SETOF dq_delivery_info
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT "public".dq_now();  -- unused: an invalid dq.now fails every call
    SELECT "public".dq__check_queue(dq_delivery_of.queue);
    SELECT "public".dq__null_check(dq_delivery_of.id IS NULL, 'id');
    SELECT m.id, m.key::text, nullif(m.channel, '')::text, m.priority, m.attempts, m.leased_at, m.due_at, m.last_error
    FROM "public".dq_messages AS m
    WHERE m.id = dq_delivery_of.id AND m.queue = dq_delivery_of.queue;
$$;

-- End the running lease of queue's message id now, without its token (a
-- consumer that hangs): the message is due now, its attempts, state and
-- last error kept, as a nack of its holder would leave it; that holder's
-- ack, nack or extend then fails. True when it was leased; false (nothing
-- changed) when it is not, or is no message of queue.
CREATE FUNCTION dq_release(queue text, id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_token uuid;
    v_error text;
BEGIN
    PERFORM "public".dq__check_queue(dq_release.queue);
    PERFORM "public".dq__null_check(dq_release.id IS NULL, 'id');
    SELECT m.lock_token, m.last_error INTO v_token, v_error
    FROM "public".dq_messages AS m
    WHERE m.id = dq_release.id AND m.queue = dq_release.queue
        AND "public".dq__is_leased(m.lock_token, m.due_at, "public".dq_now())
    FOR UPDATE;
    IF v_token IS NULL THEN
        RETURN FALSE;
    END IF;
    -- one way to hand a message back: dq_nack's (wakes, channel slots)
    RETURN "public".dq_nack(v_token, NULL, NULL, v_error, dq_release.queue);
END
$$;

-- Raise 22004/22023 unless since is a readable time and bucket is 1 minute
-- to 1 day, at most 10000 of them from since up to now (dq_dead_counts').
CREATE FUNCTION dq__check_dead_bucket(since timestamptz, bucket interval) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := "public".dq_now();
BEGIN
    PERFORM "public".dq__null_check(since IS NULL, 'since');
    PERFORM "public".dq__null_check(bucket IS NULL, 'bucket');
    PERFORM "public".dq__check_time(since, 'since');
    IF bucket < interval '1 minute' OR bucket > interval '1 day'
        OR pg_catalog.date_part('month', bucket) <> 0 OR pg_catalog.date_part('year', bucket) <> 0
        OR (v_now - since) / 10000 > bucket THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format(
                'pgdq: bucket must be from 1 minute to 1 day, at most 10000 of them since since, got %s', bucket
            );
    END IF;
END
$$;

-- The dead letters kept that failed from since on, per bucket (1 minute to
-- 1 day, at most 10000 buckets up to now) by their failed_at, per queue
-- (queue NULL: every queue), only buckets with some: failures over time
-- for every queue, history kept or not. A dead letter redriven or purged
-- is no longer counted. Reads the failed_at index from since on.
CREATE FUNCTION dq_dead_counts(queue text, since timestamptz, bucket interval) RETURNS TABLE (
    queue text,
    bucket_at timestamptz,
    dead bigint
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT "public".dq__check_queue(dq_dead_counts.queue) WHERE dq_dead_counts.queue IS NOT NULL;
    SELECT "public".dq__check_dead_bucket(dq_dead_counts.since, dq_dead_counts.bucket);
    SELECT d.queue::text, pg_catalog.date_bin(dq_dead_counts.bucket, d.failed_at, 'epoch'), count(*)
    FROM "public".dq_dead_letters AS d
    WHERE (dq_dead_counts.queue IS NULL OR d.queue = dq_dead_counts.queue)
        AND d.failed_at >= pg_catalog.date_bin(dq_dead_counts.bucket, dq_dead_counts.since, 'epoch')
    GROUP BY 1, 2
    ORDER BY 1, 2;
$$;

-- Recurring messages: occurrences are ordinary messages whose keys are
-- {key_prefix}/{config_hash}/{YYYYMMDD}T{HHMMSS}.{microseconds}Z.

-- Raise 22004/22023 unless part is 1..max_length characters without '/'.
CREATE FUNCTION dq__check_key_part(
    part text, arg_name text, max_length integer
) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM "public".dq__check_name(part, arg_name, max_length);
    IF strpos(part, '/') > 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('pgdq: %s must not contain "/"', arg_name);
    END IF;
END
$$;

-- The occurrence key of one scheduled time (the time in UTC).
CREATE FUNCTION dq__occurrence_key(
    key_prefix text, config_hash text, at timestamptz
) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT key_prefix OPERATOR(pg_catalog.||) '/'
        OPERATOR(pg_catalog.||) config_hash OPERATOR(pg_catalog.||) '/'
        OPERATOR(pg_catalog.||) pg_catalog.to_char(
            at AT TIME ZONE 'UTC', 'YYYYMMDD"T"HH24MISS.US"Z"'
        )
$$;

-- Raise 22004/22023 unless key_prefix (a cron key prefix, or a schedule's
-- name: arg_name) is 1..100 characters without '/'.
CREATE FUNCTION dq__check_key_prefix(key_prefix text, arg_name text) RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT "public".dq__check_key_part(key_prefix, arg_name, 100) $$;

-- Raise 22004/22023 unless config_hash is 1..64 characters without '/'.
CREATE FUNCTION dq__check_config_hash(config_hash text) RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT "public".dq__check_key_part(config_hash, 'config_hash', 64) $$;

-- Delete the not-leased occurrences under key_prefix/ whose keys are in
-- [from_key, below_key) (NULL: unbounded), all of them or only those whose
-- config hash is (keep_hash = false) or is not (keep_hash = true)
-- config_hash; the count deleted. Rows are locked in key order, like every
-- multi-row writer.
CREATE FUNCTION dq__cron_delete(
    queue text, key_prefix text, config_hash text, keep_hash boolean,
    from_key text DEFAULT NULL, below_key text DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
    v_deleted integer;
BEGIN
    -- Keys are in C collation, so "starts with prefix/" is the index range
    -- [prefix/, prefix0): '0' is the byte after '/'. No LIKE pattern, so a
    -- prefix with % or _ in it means only itself.
    WITH doomed AS (
        SELECT m.id
        FROM "public".dq_messages AS m
        WHERE m.queue = dq__cron_delete.queue
            AND m.key >= greatest(dq__cron_delete.key_prefix || '/', dq__cron_delete.from_key)
            AND m.key < least(dq__cron_delete.key_prefix || '0', dq__cron_delete.below_key)
            AND NOT "public".dq__is_leased(m.lock_token, m.due_at, v_now)
            AND (
                dq__cron_delete.config_hash IS NULL
                OR (
                    split_part(substr(m.key, length(dq__cron_delete.key_prefix) + 2), '/', 1)
                    = dq__cron_delete.config_hash
                ) <> dq__cron_delete.keep_hash
            )
        ORDER BY m.key
        FOR UPDATE
    )

    DELETE FROM "public".dq_messages AS m
    USING doomed AS d
    WHERE m.id = d.id;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$$;

-- Replace key_prefix's pending occurrences of other configurations and offer
-- the future ones given; the number of occurrences created (docs/sql-reference.md).
CREATE FUNCTION dq_cron_install(
    queue text,
    key_prefix text,
    config_hash text,
    scheduled_ats timestamptz[],
    payloads jsonb[],
    can_update boolean DEFAULT FALSE
) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
    v_keys text[];
    v_payloads jsonb[];
    v_ats timestamptz[];
    v_created integer;
    v_range_start text;
    v_range_end text;
BEGIN
    PERFORM "public".dq__check_queue(queue);
    PERFORM "public".dq__check_key_prefix(key_prefix, 'key_prefix');
    PERFORM "public".dq__check_config_hash(config_hash);
    PERFORM "public".dq__null_check(scheduled_ats IS NULL, 'scheduled_ats');
    PERFORM "public".dq__null_check(payloads IS NULL, 'payloads');
    PERFORM "public".dq__null_check(can_update IS NULL, 'can_update');
    IF cardinality(scheduled_ats) <> cardinality(payloads)
        OR coalesce(array_ndims(scheduled_ats), 1) > 1
        OR coalesce(array_ndims(payloads), 1) > 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format(
                'pgdq: scheduled_ats and payloads must be one-dimensional arrays of equal length, got %s and %s',
                cardinality(scheduled_ats), cardinality(payloads)
            );
    END IF;
    PERFORM "public".dq__check_elements(pg_catalog.array_position(scheduled_ats, NULL), scheduled_ats IS NULL, 'scheduled_ats');
    PERFORM "public".dq__check_elements(pg_catalog.array_position(payloads, NULL), payloads IS NULL, 'payloads');
    PERFORM "public".dq__check_time_elements(scheduled_ats, 'scheduled_ats');

    -- Installers of one prefix take turns, so the last one to run sees (and
    -- replaces) everything the one before it wrote.
    PERFORM pg_advisory_xact_lock(hashtextextended(queue || '/' || key_prefix, 0));
    -- Now, again: an installer that waited here for another must not install
    -- an occurrence that fell due while it waited, and that a consumer may
    -- have taken and acked already (two schedulers delivered one twice).
    v_now := "public".dq_now();
    -- This configuration's keys are the range [prefix/hash/, prefix/hash0).
    -- Other configurations' occurrences below it are deleted first, this
    -- one's are offered, then those above it are deleted: one ascending key
    -- order, the order every multi-row writer locks in, so none deadlock.
    v_range_start := key_prefix || '/' || config_hash || '/';
    v_range_end := key_prefix || '/' || config_hash || '0';
    PERFORM "public".dq__cron_delete(queue, key_prefix, config_hash, true, NULL, v_range_start);

    -- Occurrences at or before now are skipped: already due means already
    -- (being) processed, and must never be installed again.
    SELECT
        coalesce(array_agg("public".dq__occurrence_key(key_prefix, config_hash, o.at) ORDER BY o.ord), '{}'),
        coalesce(array_agg(o.payload ORDER BY o.ord), '{}'),
        coalesce(array_agg(o.at ORDER BY o.ord), '{}')
    INTO v_keys, v_payloads, v_ats
    FROM unnest(scheduled_ats, payloads) WITH ORDINALITY AS o (at, payload, ord)
    WHERE o.at > v_now;

    SELECT count(*) FILTER (WHERE r.outcome = 'created') INTO v_created
    FROM "public".dq_offer_many(queue, v_keys, v_payloads, v_ats, can_update) AS r;
    PERFORM "public".dq__cron_delete(queue, key_prefix, config_hash, true, v_range_end, NULL);
    RETURN v_created;
END
$$;

-- Delete the not-leased occurrences under key_prefix/ (only config_hash's
-- when given); the count deleted.
CREATE FUNCTION dq_cron_uninstall(
    queue text,
    key_prefix text,
    config_hash text DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM "public".dq__check_queue(queue);
    PERFORM "public".dq__check_key_prefix(key_prefix, 'key_prefix');
    IF config_hash IS NOT NULL THEN
        PERFORM "public".dq__check_config_hash(config_hash);
    END IF;
    RETURN "public".dq__cron_delete(queue, key_prefix, config_hash, false);
END
$$;

-- dq_cron_next: the next time a cron expression names, in a time zone (an
-- addition to version 1 of the SQL API). Standard 5 fields (minute hour day-of-month month
-- day-of-week) or 6 with a leading seconds field; lists, ranges, steps,
-- month and day names. It agrees with croniter, DST edges included:
--   * a matching wall time that a spring-forward gap skips fires once, at the
--     end of the gap (02:30 on the night New York jumps 02:00 -> 03:00 fires
--     at 03:00 EDT);
--   * a matching wall time that falls back happens twice, and fires twice
--     (01:30 EDT, then 01:30 EST).
-- When both day-of-month and day-of-week are restricted, a day matches either
-- of them (the usual OR rule); like croniter, a field that lists every value
-- counts as unrestricted when the other day field contains a "*".

-- One name or number of a cron field as its number: 10000 (out of every
-- range) for a number of more than 4 digits, NULL for an unknown name.
CREATE FUNCTION dq__cron_value(token text, field text) RETURNS integer
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE
        WHEN token OPERATOR(pg_catalog.~) '^[0-9]+$' THEN CASE
            WHEN pg_catalog.length(token) OPERATOR(pg_catalog.<=) 4 THEN token::pg_catalog.int4
            ELSE 10000
        END
        WHEN field OPERATOR(pg_catalog.=) 'month' THEN pg_catalog.array_position(
            ARRAY['jan', 'feb', 'mar', 'apr', 'may', 'jun', 'jul', 'aug', 'sep', 'oct', 'nov', 'dec'], token
        )
        WHEN field OPERATOR(pg_catalog.=) 'day of week' THEN pg_catalog.array_position(
            ARRAY['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat'], token
        ) OPERATOR(pg_catalog.-) 1
    END
$$;

-- The sorted values one cron field allows, or 22023 naming the field. At
-- most 60 list items (no field has more values); linear in the field's
-- length: each item is read once and the values are made in one query.
CREATE FUNCTION dq__cron_field(spec text, field text, lo integer, hi integer) RETURNS integer[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_parts text[] := string_to_array(lower(spec), ',');
    v_part text;
    v_match text[];
    v_from integer;
    v_to integer;
    v_step integer;
    v_froms integer[] := '{}';
    v_tos integer[] := '{}';
    v_steps integer[] := '{}';
BEGIN
    IF cardinality(v_parts) > 60 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgdq: %s field has %s list items, at most 60', field, cardinality(v_parts));
    END IF;
    FOREACH v_part IN ARRAY v_parts LOOP
        v_match := regexp_match(v_part, '^(\*|\?|([a-z0-9]+)(-([a-z0-9]+))?)(/([0-9]{1,4}))?$');
        v_step := coalesce(v_match[6]::integer, 1);
        IF v_match IS NULL OR v_step = 0 THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('pgdq: invalid %s field %L in cron expression', field, spec);
        END IF;
        -- an open range (* or a/n) of weekdays ends at 6: 7 is only an alias of Sunday
        IF v_match[1] IN ('*', '?') THEN
            v_from := lo;
            v_to := CASE WHEN field = 'day of week' THEN 6 ELSE hi END;
        ELSE
            v_from := "public".dq__cron_value(v_match[2], field);
            v_to := CASE
                WHEN v_match[4] IS NOT NULL THEN "public".dq__cron_value(v_match[4], field)
                WHEN v_match[6] IS NOT NULL THEN CASE WHEN field = 'day of week' THEN 6 ELSE hi END
                ELSE v_from
            END;
            IF v_from IS NULL OR v_to IS NULL THEN
                RAISE EXCEPTION USING ERRCODE = '22023',
                    MESSAGE = format(
                        'pgdq: unknown name %L in %s field %L',
                        CASE WHEN v_from IS NULL THEN v_match[2] ELSE v_match[4] END, field, spec
                    );
            END IF;
        END IF;
        IF v_from < lo OR v_to > hi OR v_from > v_to THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('pgdq: %s field %L is out of range %s-%s or reversed', field, spec, lo, hi);
        END IF;
        -- the usual field, one value or one range: a slice of 0..59
        IF cardinality(v_parts) = 1 AND v_step = 1 AND NOT (field = 'day of week' AND v_to = 7) THEN
            RETURN ('[0:59]={0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,'
                '30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59}'::integer[])[v_from:v_to];
        END IF;
        v_froms := v_froms || v_from;
        v_tos := v_tos || v_to;
        v_steps := v_steps || v_step;
    END LOOP;
    RETURN ARRAY(
        SELECT DISTINCT CASE WHEN field = 'day of week' AND g.v = 7 THEN 0 ELSE g.v END  -- 7 is Sunday too
        FROM unnest(v_froms, v_tos, v_steps) AS r (f, t, s)
        CROSS JOIN LATERAL generate_series(r.f, r.t, r.s) AS g (v)
        ORDER BY 1
    );
END
$$;

-- expression's fields as sorted values (seconds 0 when it has 5 fields);
-- either_day: both day fields are restricted, so a day matching either
-- counts. 22023 for an expression over 1,000 characters or a bad field.
CREATE FUNCTION dq__cron_parse(
    expression text,
    OUT seconds integer[],
    OUT minutes integer[],
    OUT hours integer[],
    OUT days integer[],
    OUT months integer[],
    OUT weekdays integer[],
    OUT either_day boolean
)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_fields text[];
BEGIN
    IF length(expression) > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgdq: expression must be at most 1000 characters, got %s', length(expression));
    END IF;
    v_fields := regexp_split_to_array(btrim(expression), '\s+');
    IF cardinality(v_fields) = 5 THEN
        v_fields := '0'::text || v_fields;
    ELSIF cardinality(v_fields) <> 6 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgdq: a cron expression has 5 fields (or 6 with seconds first), got %L', expression);
    END IF;
    seconds := "public".dq__cron_field(v_fields[1], 'second', 0, 59);
    minutes := "public".dq__cron_field(v_fields[2], 'minute', 0, 59);
    hours := "public".dq__cron_field(v_fields[3], 'hour', 0, 23);
    days := "public".dq__cron_field(v_fields[4], 'day of month', 1, 31);
    months := "public".dq__cron_field(v_fields[5], 'month', 1, 12);
    weekdays := "public".dq__cron_field(v_fields[6], 'day of week', 0, 7);
    -- croniter's reading of "restricted": not a bare *, and not every value
    -- when the other day field has a * in it
    either_day := NOT (
        v_fields[4] IN ('*', '?') OR (cardinality(days) = 31 AND strpos(v_fields[6], '*') > 0)
    ) AND NOT (
        v_fields[6] IN ('*', '?') OR (cardinality(weekdays) = 7 AND strpos(v_fields[4], '*') > 0)
    );
END
$$;

-- The UTC offset of zone at instant.
CREATE FUNCTION dq__zone_offset(instant timestamptz, zone text) RETURNS interval
LANGUAGE sql STABLE
AS $$ SELECT (instant AT TIME ZONE zone) OPERATOR(pg_catalog.-) (instant AT TIME ZONE 'UTC') $$;

-- The first whole second after lo at which zone's UTC offset is the one it
-- has at hi: the instant its clocks change, when they change once between.
CREATE FUNCTION dq__zone_shift(lo timestamptz, hi timestamptz, zone text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_target interval := "public".dq__zone_offset(hi, zone);
    v_lo timestamptz := date_trunc('second', lo);
    v_hi timestamptz := date_trunc('second', hi);
    v_mid timestamptz;
BEGIN
    WHILE v_hi - v_lo > interval '1 second' LOOP
        v_mid := v_lo + date_trunc('second', (v_hi - v_lo) / 2);
        IF "public".dq__zone_offset(v_mid, zone) = v_target THEN
            v_hi := v_mid;
        ELSE
            v_lo := v_mid;
        END IF;
    END LOOP;
    RETURN v_hi;
END
$$;

-- The instants at which zone's clocks read wall: one, two in a fall-back
-- fold, or, for a time a spring-forward gap skips, the end of the gap.
CREATE FUNCTION dq__wall_instants(wall timestamp, zone text) RETURNS SETOF timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_guess timestamptz := wall AT TIME ZONE zone;
    v_before interval := "public".dq__zone_offset(v_guess - interval '3 hours', zone);
    v_after interval := "public".dq__zone_offset(v_guess + interval '3 hours', zone);
    v_found bigint;
BEGIN
    RETURN QUERY
    SELECT DISTINCT c.at
    FROM (VALUES ((wall - v_before) AT TIME ZONE 'UTC'), ((wall - v_after) AT TIME ZONE 'UTC')) AS c (at)
    WHERE (c.at AT TIME ZONE zone) = wall
    ORDER BY c.at;
    GET DIAGNOSTICS v_found = ROW_COUNT;
    IF v_found = 0 THEN
        -- in a gap: the first instant on the new offset
        RETURN NEXT "public".dq__zone_shift(v_guess - interval '3 hours', v_guess + interval '3 hours', zone);
    END IF;
END
$$;

-- The first wall-clock time at or after start that the parsed fields name
-- (see dq__cron_parse); NULL if none before the fifth year from start's day.
CREATE FUNCTION dq__cron_next_wall(
    start timestamp,
    seconds integer[],
    minutes integer[],
    hours integer[],
    days integer[],
    months integer[],
    weekdays integer[],
    either_day boolean
) RETURNS timestamp
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_day date := start::date;
    v_end date := start::date + 366 * 5;
    v_wall timestamp;
    v_hour integer;
    v_minute integer;
    v_second integer;
BEGIN
    WHILE v_day < v_end LOOP
        IF NOT extract(MONTH FROM v_day)::integer = ANY(months) THEN
            v_day := date_trunc('month', v_day) + interval '1 month';
            CONTINUE;
        END IF;
        IF (either_day AND (extract(DAY FROM v_day)::integer = ANY(days)
                OR extract(DOW FROM v_day)::integer = ANY(weekdays)))
            OR (NOT either_day AND extract(DAY FROM v_day)::integer = ANY(days)
                AND extract(DOW FROM v_day)::integer = ANY(weekdays)) THEN
            FOREACH v_hour IN ARRAY hours LOOP
                CONTINUE WHEN v_day + make_interval(hours => v_hour + 1) <= start;
                FOREACH v_minute IN ARRAY minutes LOOP
                    CONTINUE WHEN v_day + make_interval(hours => v_hour, mins => v_minute + 1) <= start;
                    FOREACH v_second IN ARRAY seconds LOOP
                        v_wall := v_day + make_interval(hours => v_hour, mins => v_minute, secs => v_second);
                        IF v_wall >= start THEN
                            RETURN v_wall;
                        END IF;
                    END LOOP;
                END LOOP;
            END LOOP;
        END IF;
        v_day := v_day + 1;
    END LOOP;
    RETURN NULL;
END
$$;

-- The first time after `after` that the parsed fields name in zone (NULL
-- if none within 5 years), with dq_cron_next's DST rules. A few offset
-- probes and calendar steps, near a DST change too: with the clocks
-- reading w(t) at instant t, the wall times after `after` are walked in
-- order and the first that names a time is mapped to its instants, which
-- is right unless the clocks fall back soon (within 3 hours; changes are
-- assumed at least 6 hours apart): then the rest of the first pass comes
-- first, and then the times from the fold on.
CREATE FUNCTION dq__cron_next_at(
    after timestamptz,
    zone text,
    seconds integer[],
    minutes integer[],
    hours integer[],
    days integer[],
    months integer[],
    weekdays integer[],
    either_day boolean
) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_offset interval := "public".dq__zone_offset(after, zone);
    v_later interval := "public".dq__zone_offset(after + interval '3 hours', zone);
    v_from timestamp := date_trunc('second', after AT TIME ZONE zone) + interval '1 second';
    v_floor timestamptz := after;  -- the answer is later than this
    v_fold timestamptz;
    v_wall timestamp;
    v_at timestamptz;
BEGIN
    IF v_later < v_offset THEN
        -- the clocks fall back within 3 hours, at v_fold: first the rest of
        -- the first pass, then from the fold on, where they repeat times
        v_fold := "public".dq__zone_shift(after, after + interval '3 hours', zone);
        v_wall := "public".dq__cron_next_wall(v_from, seconds, minutes, hours, days, months, weekdays, either_day);
        IF v_wall < (v_fold AT TIME ZONE 'UTC') + v_offset THEN
            RETURN (v_wall - v_offset) AT TIME ZONE 'UTC';
        END IF;
        v_from := v_fold AT TIME ZONE zone;
        v_floor := v_fold - interval '1 microsecond';
    END IF;
    FOR i IN 1..10 LOOP
        v_wall := "public".dq__cron_next_wall(v_from, seconds, minutes, hours, days, months, weekdays, either_day);
        IF v_wall IS NULL THEN
            RETURN NULL;
        END IF;
        v_at := (v_wall - v_offset) AT TIME ZONE 'UTC';
        -- no change of the clocks within 3 hours, and the time is within them
        IF v_later = v_offset AND v_at <= after + interval '3 hours' THEN
            RETURN v_at;
        END IF;
        SELECT min(w.at) INTO v_at FROM "public".dq__wall_instants(v_wall, zone) AS w (at) WHERE w.at > v_floor;
        IF v_at IS NOT NULL THEN
            RETURN v_at;
        END IF;
        v_from := v_wall + interval '1 second';
    END LOOP;
    RETURN NULL;
END
$$;

-- The first time after `after` that expression names in zone (NULL if none
-- within 5 years, or none before year 10000); 22023 for an invalid
-- expression or zone, or an `after` outside years 1 to 9999 UTC (the
-- readable range, dq__valid_time). STABLE, not IMMUTABLE: the answer
-- depends on the server's time zone data.
CREATE FUNCTION dq_cron_next(expression text, after timestamptz, timezone text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_cron record;
    v_at timestamptz;
BEGIN
    PERFORM "public".dq__null_check(expression IS NULL, 'expression');
    PERFORM "public".dq__null_check(after IS NULL, 'after');
    PERFORM "public".dq__null_check(timezone IS NULL, 'timezone');
    PERFORM "public".dq__check_time(after, 'after');
    v_cron := "public".dq__cron_parse(expression);
    v_at := "public".dq__cron_next_at(
        after, timezone, v_cron.seconds, v_cron.minutes, v_cron.hours,
        v_cron.days, v_cron.months, v_cron.weekdays, v_cron.either_day
    );
    -- an occurrence past the readable range is none
    RETURN CASE WHEN v_at < "public".dq__time_end() THEN v_at END;
END
$$;

-- Schedules kept by the database (additions to version 1 of the SQL API): a named cron
-- schedule per queue whose occurrences the queue's own polls turn into
-- messages with occurrence keys, exactly once however many consumers poll,
-- with no scheduler process. dq_next_due counts the next occurrence, so an
-- idle worker wakes for it.

-- The config hash of a schedule: its occurrences' keys carry it.
CREATE FUNCTION dq__schedule_hash(expression text, timezone text, payload jsonb) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT pg_catalog.left(pg_catalog.md5(
        pg_catalog.jsonb_build_array(expression, timezone, payload)::pg_catalog.text
    ), 16)
$$;

-- Create or replace queue's schedule `name` (the key prefix of its
-- occurrences); its next occurrence after now. A changed expression, zone or
-- payload replaces the old configuration's pending (not leased) occurrences;
-- setting the same one again keeps its place (an occurrence already due is
-- still delivered by the next poll) and ends a failing schedule's back-off.
-- max_missed: how many of the most recent occurrences one poll delivers when
-- several came due while nobody polled (1: the latest only, never a flood).
CREATE FUNCTION dq_schedule_set(
    queue text,
    name text,
    expression text,
    timezone text DEFAULT 'UTC',
    payload jsonb DEFAULT '{}',
    max_missed integer DEFAULT 1
) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := "public".dq_now();
    v_hash text;
    v_next timestamptz;
BEGIN
    PERFORM "public".dq__check_queue(queue);
    PERFORM "public".dq__check_key_prefix(name, 'name');
    PERFORM "public".dq__null_check(payload IS NULL, 'payload');
    PERFORM "public".dq__check_between(max_missed, 'max_missed', 1, 100);
    v_next := "public".dq_cron_next(expression, v_now, timezone);  -- checks both
    IF v_next IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgdq: %L names no time in the next 5 years (before year 10000 UTC)', expression);
    END IF;
    v_hash := "public".dq__schedule_hash(expression, timezone, payload);

    INSERT INTO "public".dq_schedules AS s (queue, name, expression, timezone, payload, config_hash, max_missed, next_at)
    VALUES (dq_schedule_set.queue, dq_schedule_set.name, expression, timezone, payload, v_hash, max_missed, v_next)
    ON CONFLICT ON CONSTRAINT dq_schedules_pkey DO UPDATE
        SET expression = excluded.expression,
            timezone = excluded.timezone,
            payload = excluded.payload,
            config_hash = excluded.config_hash,
            max_missed = excluded.max_missed,
            -- the same configuration keeps its place (a failing one's is
            -- missed_from: it is tried again at the next poll); an ended
            -- one starts again
            next_at = CASE
                WHEN s.config_hash = excluded.config_hash THEN coalesce(s.missed_from, s.next_at, excluded.next_at)
                ELSE excluded.next_at
            END,
            missed_from = NULL,
            failures = 0,
            last_error = NULL,
            last_error_at = NULL;
    PERFORM "public".dq__cron_delete(dq_schedule_set.queue, dq_schedule_set.name, v_hash, TRUE);
    PERFORM "public".dq__wake(dq_schedule_set.queue);  -- idle workers re-read dq_next_due
    RETURN v_next;
END
$$;

-- Remove queue's schedule `name` and its pending occurrences; true if it existed.
CREATE FUNCTION dq_schedule_remove(queue text, name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := "public".dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM "public".dq__check_queue(queue);
    PERFORM "public".dq__check_key_prefix(name, 'name');
    DELETE FROM "public".dq_schedules AS s
    WHERE s.queue = dq_schedule_remove.queue AND s.name = dq_schedule_remove.name;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    PERFORM "public".dq__cron_delete(dq_schedule_remove.queue, dq_schedule_remove.name, NULL, FALSE);
    RETURN TRUE;
END
$$;

-- The schedules (of queue, when given) with their next occurrence (while
-- failing: the next attempt) and their last error. Does not read the clock.
CREATE FUNCTION dq_schedules(queue text DEFAULT NULL) RETURNS TABLE (
    queue text,
    name text,
    expression text,
    timezone text,
    payload jsonb,
    max_missed integer,
    next_at timestamptz,
    last_error text,
    last_error_at timestamptz,
    failures integer
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- the check is a statement of its own: it runs, row or no row
    SELECT "public".dq__check_queue(dq_schedules.queue) WHERE dq_schedules.queue IS NOT NULL;
    SELECT s.queue::text, s.name::text, s.expression, s.timezone, s.payload, s.max_missed, s.next_at,
        s.last_error, s.last_error_at, s.failures
    FROM "public".dq_schedules AS s
    WHERE dq_schedules.queue IS NULL OR s.queue = dq_schedules.queue
    ORDER BY s.queue, s.name;
$$;

-- The occurrences of a schedule from next_at to until, oldest first: the
-- `keep` most recent. Bounded work however long nobody polled: the
-- expression is parsed once, and it looks back from until through doubling
-- windows (then halves the last one when a burst of occurrences made it hold
-- more than 2 * keep + 10), each look giving up after that many, and all of
-- them together after 2,000 occurrences (only bursts of thousands get there;
-- it then returns the most recent it has, fewer than keep).
CREATE FUNCTION dq__due_occurrences(
    expression text, timezone text, next_at timestamptz, until timestamptz, keep integer
) RETURNS timestamptz[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_cron record;
    v_limit integer := 2 * keep + 10;  -- a look gives up beyond this many
    v_budget integer := 2000;          -- occurrences still to be computed
    v_window interval := interval '1 second';
    v_good timestamptz := until;       -- from here: fewer than keep...
    v_best timestamptz[] := '{}';      -- ...namely these
    v_bad timestamptz;                 -- from here: more than v_limit
    v_from timestamptz;
    v_at timestamptz;
    v_due timestamptz[];
    v_count integer;
    v_complete boolean;
BEGIN
    v_cron := "public".dq__cron_parse(expression);
    LOOP
        v_from := CASE
            WHEN v_bad IS NOT NULL THEN v_bad + (v_good - v_bad) / 2
            WHEN until - next_at <= v_window THEN next_at
            ELSE until - v_window
        END;
        -- the occurrences from v_from to until: their count and the last keep
        v_due := '{}';
        v_count := 0;
        v_complete := FALSE;
        v_at := v_from - interval '1 microsecond';
        WHILE v_count <= v_limit AND v_budget > 0 LOOP
            v_at := "public".dq__cron_next_at(
                v_at, timezone, v_cron.seconds, v_cron.minutes, v_cron.hours,
                v_cron.days, v_cron.months, v_cron.weekdays, v_cron.either_day
            );
            v_budget := v_budget - 1;
            v_complete := v_at IS NULL OR v_at > until;
            EXIT WHEN v_complete;
            v_due := (v_due || v_at)[greatest(1, cardinality(v_due) + 2 - keep):];
            v_count := v_count + 1;
        END LOOP;
        IF v_complete THEN
            IF v_count >= keep OR v_from <= next_at THEN
                RETURN v_due;
            END IF;
            v_good := v_from;
            v_best := v_due;
            v_window := v_window * 2;
        ELSIF v_count <= v_limit THEN
            RETURN v_best;  -- out of budget
        ELSE
            v_bad := v_from;
        END IF;
    END LOOP;
END
$$;

-- Turn queue's due schedule occurrences into messages and move each
-- schedule's next_at past now. Each schedule is done in a subtransaction:
-- when it fails (any error, or a statement timeout that fires meanwhile) its
-- error goes into last_error, it is tried again 1 minute later, then after
-- 2, 4 ... at most 60 (next_at; missed_from keeps the first occurrence still
-- to deliver), and the poll goes on. Bounded: no schedule is started after
-- 50 ms (the rest wait for the next poll), nor after a statement timeout.
-- Schedules another poll is materialising are skipped (it does them), and
-- occurrence keys make a repeat harmless.
CREATE FUNCTION dq__materialise(queue text, now_at timestamptz) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_started timestamptz := clock_timestamp();
    v_schedule record;
    v_due timestamptz[];
    v_next timestamptz;
    v_state text;
    v_message text;
    v_timed_out boolean := FALSE;
BEGIN
    FOR v_schedule IN
        SELECT s.* FROM "public".dq_schedules AS s
        WHERE s.queue = dq__materialise.queue AND s.next_at <= dq__materialise.now_at
        ORDER BY s.name
        FOR UPDATE SKIP LOCKED
    LOOP
        EXIT WHEN clock_timestamp() - v_started > interval '50 milliseconds';
        v_state := NULL;
        BEGIN
            -- first, as it names an `after` out of range; NULL (none in the
            -- next 5 years, or none before year 10000) ends the schedule
            v_next := "public".dq_cron_next(v_schedule.expression, dq__materialise.now_at, v_schedule.timezone);
            v_due := "public".dq__due_occurrences(
                v_schedule.expression, v_schedule.timezone, coalesce(v_schedule.missed_from, v_schedule.next_at),
                dq__materialise.now_at, v_schedule.max_missed
            );
            INSERT INTO "public".dq_messages (queue, key, payload, scheduled_at, due_at, created_at)
            SELECT dq__materialise.queue, "public".dq__occurrence_key(v_schedule.name, v_schedule.config_hash, d.at),
                v_schedule.payload, d.at, d.at, dq__materialise.now_at
            FROM unnest(v_due) AS d (at)
            ORDER BY 2
            ON CONFLICT (queue, key) WHERE key IS NOT NULL DO NOTHING;
            UPDATE "public".dq_schedules AS s
            SET next_at = v_next,
                missed_from = NULL,
                failures = 0,
                last_error = NULL,
                last_error_at = NULL
            WHERE s.queue = dq__materialise.queue AND s.name = v_schedule.name;
        EXCEPTION
            WHEN query_canceled THEN
                -- a statement timeout is this schedule's error; a cancel
                -- request cancels the poll. The timeout's clock starts with
                -- the statement's first protocol message (Parse, or Bind),
                -- statement_timestamp() at its Execute, milliseconds later
                -- (6 ms seen with psycopg): measured from the latest time
                -- known to precede the first message (the transaction's
                -- start; at most 1 s before Execute), or a timeout that
                -- fired on time would be taken for a cancel
                IF current_setting('statement_timeout')::interval = interval '0'
                    OR clock_timestamp() - greatest(transaction_timestamp(), statement_timestamp() - interval '1 second')
                    < current_setting('statement_timeout')::interval THEN
                    RAISE;
                END IF;
                GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
                v_timed_out := TRUE;
            WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
        END;
        IF v_state IS NOT NULL THEN
            UPDATE "public".dq_schedules AS s
            SET missed_from = coalesce(s.missed_from, s.next_at),
                -- a retry past year 9999 is none: the schedule ends (NULL)
                next_at = nullif(
                    least(
                        dq__materialise.now_at + least(
                            interval '1 hour', interval '1 minute' * power(2, least(s.failures, 6))
                        ),
                        "public".dq__time_end()
                    ),
                    "public".dq__time_end()
                ),
                failures = s.failures + 1,
                last_error = format('%s (SQLSTATE %s)', left(v_message, 1000), v_state),
                last_error_at = dq__materialise.now_at
            WHERE s.queue = dq__materialise.queue AND s.name = v_schedule.name;
        END IF;
        EXIT WHEN v_timed_out;
    END LOOP;
END
$$;

-- Install and upgrade warn when every role may create objects in pgdq's schema.

-- Raise a WARNING when PUBLIC may create objects in schema. pgdq's functions
-- never call what others create there (docs/security.md), but the roles that
-- use pgdq search that schema too: anyone could plant functions they call.
CREATE FUNCTION dq__warn_if_open_schema(schema text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF has_schema_privilege('public', schema, 'CREATE') THEN
        RAISE WARNING USING
            MESSAGE = format('pgdq: every role may create objects in schema %I', schema),
            DETAIL = 'pgdq''s functions never call objects created there, but the roles that use '
            'pgdq search that schema too: anyone may plant functions they call by mistake.',
            HINT = format(
                'REVOKE CREATE ON SCHEMA %I FROM PUBLIC, or install pgdq into a schema of its own.', schema
            );
    END IF;
END
$$;

SELECT "public".dq__warn_if_open_schema(pg_catalog.current_schema());
COMMIT;
