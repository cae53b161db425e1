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
-- the statement that wrote it. Triggers write them, so every path that
-- writes messages counts, pgdq's functions and any other; since 1.3 the
-- statements of the hot paths (send, offers of new keys, the plain lease,
-- acks of queues without history) write their own deltas in the same
-- statement instead, and mark themselves so that the triggers skip them
-- (dq__counting_inline): the triggers had cost a sixth of a single send.
-- A due bin is 10 minutes of due_at (dq__due_bin): the overview
-- sums whole bins and counts only the current bin's messages still ahead of
-- now in the poll indexes (50_manage.sql).
CREATE TABLE dq_counts (
    queue text COLLATE "C" NOT NULL,
    -- the start of the bin holding the messages' due_at; '-infinity' for
    -- bins folded more than 7 days after they ended (all due long ago)
    due_bin timestamptz NOT NULL,
    -- lock_token IS NOT NULL (leased, or a lease that expired)
    leased boolean NOT NULL,
    -- within 2^32 either way: a sum of rows (a fold) cannot overflow
    -- before 2^31 of them, whatever a role that may add counts adds
    n bigint NOT NULL CONSTRAINT dq_counts_n CHECK (n BETWEEN -4294967296 AND 4294967296)
) WITH (
    -- every fold leaves the rows it summed dead: vacuum as soon as
    -- autovacuum comes by, with no cost delay, so that the table (which
    -- folds and dq_stats() read whole) stays a few pages
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_cost_delay = 0
);

COMMENT ON TABLE dq_counts IS
'pgdq message counts by queue and due time (deltas, summed on read). Kept by writes to dq_messages; internal.';

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
    SELECT pg_catalog.date_bin(@extschema@.dq__due_bin_width(), due_at, '2000-01-01 00:00+00');
$$;

-- Whether a writer should fold the counts now (dq__fold_counts): one
-- statement in 4,096. A fold in REPEATABLE READ or SERIALIZABLE could fail
-- on a row that a concurrent fold took: writers there never fold. (A SQL
-- expression: it inlines into its callers.)
CREATE FUNCTION dq__time_to_fold() RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT pg_catalog.random() OPERATOR(pg_catalog.<) (1.0 OPERATOR(pg_catalog./) 4096)::pg_catalog.float8
        AND pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed';
$$;

-- Sum the count rows this transaction can lock into one row per (queue, bin,
-- leased); bins that ended more than 7 days ago become one '-infinity' bin
-- per queue (dq_stats reads such bins as due). Never waits: rows another
-- transaction holds (a concurrent fold) are left for later. As pgdq's owner
-- (SECURITY DEFINER): writers may add counts but not take them; a fold
-- leaves every sum as it was.
CREATE FUNCTION dq__fold_counts() RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- No JIT: a fold runs inside the writer's statement, and so under its
-- settings; the hot functions set enable_seqscan = off, which prices the
-- fold's (unavoidable) scan of dq_counts above jit_above_cost. Compiling it
-- took 60-90 ms a fold, a fifth of every single send's time at saturation.
SET jit = off
AS $$
    WITH taken AS (
        DELETE FROM @extschema@.dq_counts AS c
        WHERE c.ctid = ANY (ARRAY(SELECT l.ctid FROM @extschema@.dq_counts AS l FOR UPDATE SKIP LOCKED))
        RETURNING c.queue, c.due_bin, c.leased, c.n
    ),
    binned AS (
        SELECT
            t.queue,
            t.due_bin < statement_timestamp() - interval '7 days' - @extschema@.dq__due_bin_width() AS folded,
            t.due_bin, t.leased, t.n
        FROM taken AS t
    )
    INSERT INTO @extschema@.dq_counts (queue, due_bin, leased, n)
    SELECT
        b.queue,
        CASE WHEN b.folded THEN '-infinity' ELSE b.due_bin END,
        b.leased AND NOT b.folded,
        sum(b.n)
    FROM binned AS b
    GROUP BY 1, 2, 3
    HAVING sum(b.n) <> 0;
$$;

-- Mark the next statement as counting its own rows, or with inserts_only
-- only the rows it inserts (an upsert, whose updates the trigger counts):
-- dq.counted holds a stack of marks, each a comma, the trigger depth
-- (pg_trigger_depth()) of a statement that counts its own rows and 'i' for
-- inserts only; pushed just before the statement, popped just after
-- (dq__counted_inline). The count triggers skip a statement whose depth is
-- the last mark (their WHEN clauses, below), so that writes nested deeper
-- (a user's trigger writing messages, or calling pgdq) are still counted by
-- them. Local to the transaction: an error undoes it. True when marked;
-- false, marking nothing, when row-level security on dq_messages applies to
-- the caller: a tenant adds no count of its own (the policy below refuses
-- it), the triggers count its writes as pgdq's owner. (A SQL expression, as
-- dq__counted_inline: it inlines into its callers' assignments, which then
-- cost no function call; as plpgsql functions the two were a tenth of a
-- single poll.)
CREATE FUNCTION dq__counting_inline(inserts_only boolean DEFAULT FALSE) RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE
        WHEN pg_catalog.row_security_active('@extschema@.dq_messages'::pg_catalog.regclass) THEN FALSE
        ELSE pg_catalog.set_config(
            'dq.counted',
            coalesce(pg_catalog.current_setting('dq.counted', TRUE), '') OPERATOR(pg_catalog.||) ','
            OPERATOR(pg_catalog.||) pg_catalog.pg_trigger_depth()::pg_catalog.text
            OPERATOR(pg_catalog.||) CASE WHEN inserts_only THEN 'i' ELSE '' END,
            TRUE
        ) IS NOT NULL
    END;
$$;

-- After the statement that counted its own rows (marked: what
-- dq__counting_inline returned): pop its mark, and now and then fold the
-- counts (dq__time_to_fold). False: nothing is marked any more.
CREATE FUNCTION dq__counted_inline(marked boolean) RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE
        WHEN marked IS NOT TRUE THEN FALSE
        -- set_config never returns NULL: this pops the mark and goes on
        WHEN pg_catalog.set_config(
            'dq.counted',
            pg_catalog.regexp_replace(pg_catalog.current_setting('dq.counted'), ',[^,]*$', ''),
            TRUE
        ) IS NULL THEN FALSE
        -- now and then a fold; num_nulls is never negative: false
        ELSE pg_catalog.num_nulls(
            CASE WHEN @extschema@.dq__time_to_fold() THEN @extschema@.dq__fold_counts() END
        ) OPERATOR(pg_catalog.<) 0
    END;
$$;

-- Who sees the counts: roles granted SELECT (the README's consumer role,
-- for dq_stats) that row-level security does not isolate. A role under
-- policies on dq_messages (docs/security.md) sees no count, and its
-- dq_stats() reads the messages its policies let it see, as in 1.1.
ALTER TABLE dq_counts ENABLE ROW LEVEL SECURITY;
CREATE POLICY dq_counts_unless_isolated ON dq_counts
USING ((SELECT NOT pg_catalog.row_security_active('@extschema@.dq_messages'::regclass)));

-- Who adds counts (1.3): the roles that may write messages (INSERT, the
-- README's roles), whose hot statements count their own rows; the policy
-- above refuses a row to a role under row-level security (a tenant), whose
-- writes the triggers count. A role that may add counts could add false
-- ones, or mark its own direct writes as counted (dq.counted): it would
-- skew the overview of the queues it may empty anyway; pgdq's functions
-- never do (docs/security.md). No count of one statement comes near the
-- bound of dq_counts_n, which keeps false rows from overflowing a fold.

-- The trigger functions run as pgdq's owner (SECURITY DEFINER, with the
-- fold the only ones: pgtap/00_install.sql), so
-- that every other write to dq_messages is counted, by any role. They take
-- no argument, and count only when called as pgdq's own count triggers
-- (dq__is_count_trigger).

-- Whether a trigger call is one of pgdq's own count triggers: AFTER, FOR
-- EACH STATEMENT, on dq_messages, by its name. A role may attach a trigger
-- function to a table of its own, or (with the TRIGGER right) add another
-- trigger to dq_messages that would count twice.
CREATE FUNCTION dq__is_count_trigger(relid oid, name text, level text, fired text) RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$
    SELECT relid OPERATOR(pg_catalog.=) '@extschema@.dq_messages'::pg_catalog.regclass::pg_catalog.oid
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
    IF NOT @extschema@.dq__is_count_trigger(TG_RELID, TG_NAME::text, TG_LEVEL, TG_WHEN) THEN
        PERFORM @extschema@.dq__count_refuse(TG_RELID, TG_NAME::text);
    END IF;
    INSERT INTO @extschema@.dq_counts (queue, due_bin, leased, n)
    SELECT
        r.queue, @extschema@.dq__due_bin(r.due_at), r.lock_token IS NOT NULL,
        CASE TG_OP WHEN 'DELETE' THEN -count(*) ELSE count(*) END
    FROM changed_rows AS r
    GROUP BY 1, 2, 3;
    IF @extschema@.dq__time_to_fold() THEN
        PERFORM @extschema@.dq__fold_counts();
    END IF;
    IF TG_OP = 'DELETE' THEN
        v_outcome := @extschema@.dq__deleting_outcome();
    END IF;
    IF v_outcome IS NULL THEN
        RETURN NULL;
    END IF;

    -- History (57_history.sql): the records, then their deltas, in one
    -- statement that writes nothing for a queue without retention; stamped
    -- by the history clock (never ahead of the server's)
    v_now := @extschema@.dq__history_now();
    WITH kept AS (
        INSERT INTO @extschema@.dq_history (
            queue, key, id, outcome, payload, state, channel, priority, created_at, scheduled_at,
            last_leased_at, finished_at, attempts, last_error, headers, lateness
        )
        SELECT r.queue, r.key, r.id, v_outcome, r.payload, r.state, r.channel, r.priority,
            r.created_at, r.scheduled_at, r.leased_at, v_now, r.attempts, r.last_error, r.headers,
            greatest(r.leased_at - r.leased_due_at, interval '0')
        FROM changed_rows AS r
        -- the queues keeping history, read once (not a probe per row)
        WHERE r.queue = ANY (ARRAY(SELECT q.queue FROM @extschema@.dq_queues AS q WHERE q.retain IS NOT NULL))
        RETURNING queue, last_leased_at, lateness
    ),
    -- one outcome a statement; lateness and run time of delivered messages
    -- that were acked or are dead (dq__history_measures, spelled out here)
    measured AS (
        SELECT k.queue, left(v_outcome, 1)::"char" AS measure, 0::smallint AS bin
        FROM kept AS k
        UNION ALL
        SELECT k.queue, 'l', @extschema@.dq__duration_bin(k.lateness)
        FROM kept AS k
        WHERE v_outcome IN ('acked', 'dead') AND k.last_leased_at IS NOT NULL
        UNION ALL
        SELECT k.queue, 'r', @extschema@.dq__duration_bin(v_now - k.last_leased_at)
        FROM kept AS k
        WHERE v_outcome IN ('acked', 'dead') AND k.last_leased_at IS NOT NULL
    ),
    tallied AS (
        INSERT INTO @extschema@.dq_history_deltas (queue, at, measure, bin, n)
        SELECT m.queue, date_bin('1 second', v_now, 'epoch'), m.measure, m.bin, count(*)
        FROM measured AS m
        GROUP BY m.queue, m.measure, m.bin
    )
    SELECT count(*), array_agg(DISTINCT k.queue) INTO v_recorded, v_queues
    FROM kept AS k;
    IF v_recorded > 0 AND current_setting('transaction_isolation') = 'read committed' THEN
        IF random() < 1.0 / 256 THEN
            PERFORM @extschema@.dq__fold_history();
        END IF;
        -- twice, on average, what recording adds, of these queues only, and
        -- never more than max(1024, 2 n) records a statement
        IF random() < v_recorded / 512.0 THEN
            PERFORM @extschema@.dq__expire_history(v_queues, greatest(1024, 2 * v_recorded)::integer);
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
    IF NOT @extschema@.dq__is_count_trigger(TG_RELID, TG_NAME::text, TG_LEVEL, TG_WHEN) THEN
        PERFORM @extschema@.dq__count_refuse(TG_RELID, TG_NAME::text);
    END IF;
    INSERT INTO @extschema@.dq_counts (queue, due_bin, leased, n)
    SELECT d.queue, d.due_bin, d.leased, sum(d.n)
    FROM (
        SELECT r.queue, @extschema@.dq__due_bin(r.due_at) AS due_bin, r.lock_token IS NOT NULL AS leased, 1 AS n
        FROM new_rows AS r
        UNION ALL
        SELECT r.queue, @extschema@.dq__due_bin(r.due_at), r.lock_token IS NOT NULL, -1
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
    IF NOT @extschema@.dq__is_count_trigger(TG_RELID, TG_NAME::text, TG_LEVEL, TG_WHEN) THEN
        PERFORM @extschema@.dq__count_refuse(TG_RELID, TG_NAME::text);
    END IF;
    -- TRUNCATE, not DELETE: no count a concurrent fold or an older snapshot
    -- holds survives it
    BEGIN
        TRUNCATE @extschema@.dq_counts;
    EXCEPTION WHEN object_in_use THEN
        -- The same statement truncates dq_counts too (TRUNCATE dq_messages,
        -- dq_counts), or a cursor of this session reads it. Then the lock a
        -- TRUNCATE would take, and a DELETE with a snapshot taken after it:
        -- every count, none a fold adds later. A transaction with an older
        -- snapshot (REPEATABLE READ, SERIALIZABLE) cannot: it fails as before.
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE;
        END IF;
        LOCK TABLE @extschema@.dq_counts IN ACCESS EXCLUSIVE MODE;
        DELETE FROM @extschema@.dq_counts;
    END;
    RETURN NULL;
END
$$;

-- The WHEN clauses skip the statements that counted their own rows
-- (dq__counting_inline): built-in functions only, since a trigger's WHEN is
-- prepared anew for every statement (a SQL function's body would be parsed
-- each time: a tenth of a single send).
CREATE TRIGGER dq_count_inserted AFTER INSERT ON dq_messages
REFERENCING NEW TABLE AS changed_rows
FOR EACH STATEMENT
WHEN (
    pg_catalog.rtrim(pg_catalog.split_part(pg_catalog.current_setting('dq.counted', TRUE), ',', -1), 'i')
    IS DISTINCT FROM pg_catalog.pg_trigger_depth()::pg_catalog.text
)
EXECUTE FUNCTION dq__count_rows();

CREATE TRIGGER dq_count_deleted AFTER DELETE ON dq_messages
REFERENCING OLD TABLE AS changed_rows
FOR EACH STATEMENT
WHEN (
    pg_catalog.split_part(pg_catalog.current_setting('dq.counted', TRUE), ',', -1)
    IS DISTINCT FROM pg_catalog.pg_trigger_depth()::pg_catalog.text
)
EXECUTE FUNCTION dq__count_rows();

CREATE TRIGGER dq_count_updated AFTER UPDATE ON dq_messages
REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
FOR EACH STATEMENT
WHEN (
    pg_catalog.split_part(pg_catalog.current_setting('dq.counted', TRUE), ',', -1)
    IS DISTINCT FROM pg_catalog.pg_trigger_depth()::pg_catalog.text
)
EXECUTE FUNCTION dq__count_updated();

CREATE TRIGGER dq_count_truncated AFTER TRUNCATE ON dq_messages
FOR EACH STATEMENT EXECUTE FUNCTION dq__count_truncated();
