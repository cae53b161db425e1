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
    IF v_at IS NULL OR NOT @extschema@.dq__valid_time(v_at) THEN
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
        @extschema@.dq__pinned_now(nullif(pg_catalog.current_setting('dq.now', true), '')),
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

-- The queues keeping history (1.3): whether an ack may have records to
-- write is one probe (57_history.sql, dq__may_keep_history), however many
-- queues have settings.
CREATE INDEX dq_queues_retained ON dq_queues (queue)
WHERE retain IS NOT NULL;

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
