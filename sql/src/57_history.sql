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
USING ((SELECT NOT pg_catalog.row_security_active('@extschema@.dq_messages'::regclass)));
ALTER TABLE dq_history_deltas ENABLE ROW LEVEL SECURITY;
CREATE POLICY dq_history_deltas_unless_isolated ON dq_history_deltas
USING ((SELECT NOT pg_catalog.row_security_active('@extschema@.dq_messages'::regclass)));
ALTER TABLE dq_history_tallies ENABLE ROW LEVEL SECURITY;
CREATE POLICY dq_history_tallies_unless_isolated ON dq_history_tallies
USING ((SELECT NOT pg_catalog.row_security_active('@extschema@.dq_messages'::regclass)));

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
        DELETE FROM @extschema@.dq_history_deltas AS d
        WHERE d.ctid = ANY (ARRAY(SELECT l.ctid FROM @extschema@.dq_history_deltas AS l FOR UPDATE SKIP LOCKED))
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
        DELETE FROM @extschema@.dq_history_tallies AS y
        WHERE y.ctid = ANY (ARRAY(
            SELECT t.ctid
            FROM @extschema@.dq_history_tallies AS t
            INNER JOIN spans AS p ON t.queue = p.queue AND t.width = p.width AND t.at = p.at
            FOR UPDATE OF t SKIP LOCKED
        ))
        RETURNING y.queue, y.width, y.at, y.measure, y.bin, y.n
    )
    INSERT INTO @extschema@.dq_history_tallies (queue, width, at, measure, bin, n)
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
    SELECT pg_catalog.timestamptz_smaller(@extschema@.dq_now(), pg_catalog.clock_timestamp())
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
    v_now timestamptz := @extschema@.dq__history_now();
    v_queue record;
    v_left integer := max_rows;
    v_tallies_left integer := max_rows;
    v_deleted integer;
BEGIN
    FOR v_queue IN
        SELECT q.queue, @extschema@.dq__history_cut(q.history_keep, q.history_from, v_now) AS cut
        FROM @extschema@.dq_queues AS q
        WHERE q.queue = ANY (dq__expire_history.queues) AND q.history_keep IS NOT NULL
        ORDER BY q.queue
    LOOP
        EXIT WHEN v_left <= 0 AND v_tallies_left <= 0;
        DELETE FROM @extschema@.dq_history AS h
        WHERE h.ctid = ANY (ARRAY(
            SELECT o.ctid FROM @extschema@.dq_history AS o
            WHERE o.queue = v_queue.queue AND o.finished_at < v_queue.cut
            ORDER BY o.finished_at
            LIMIT greatest(v_left, 0)
            FOR UPDATE SKIP LOCKED
        ));
        GET DIAGNOSTICS v_deleted = ROW_COUNT;
        v_left := v_left - v_deleted;
        DELETE FROM @extschema@.dq_history_tallies AS y
        WHERE y.ctid = ANY (ARRAY(
            SELECT o.ctid FROM @extschema@.dq_history_tallies AS o
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
    v_now timestamptz := @extschema@.dq__history_now();
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_retain.queue);
    -- a period: no part negative ('1 mon -29 days' is 22023), the whole
    -- longer than zero
    IF keep <= interval '0' OR keep > interval '3650 days' OR @extschema@.dq__has_negative_part(keep) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format('pgdq: keep must be positive and at most 3650 days, or NULL, got %s', keep);
    END IF;
    INSERT INTO @extschema@.dq_queues AS q (queue, retain, history_keep)
    VALUES (dq_retain.queue, keep, keep)
    ON CONFLICT (queue) DO UPDATE
        SET retain = excluded.retain,
            history_keep = coalesce(excluded.history_keep, q.history_keep),
            history_from = CASE
                WHEN q.history_keep IS NOT NULL THEN @extschema@.dq__history_cut(q.history_keep, q.history_from, v_now)
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
    SELECT @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    SELECT @extschema@.dq__check_queue(dq_history.queue);
    SELECT @extschema@.dq__check_key(dq_history.key, 'key') WHERE dq_history.key IS NOT NULL;
    SELECT @extschema@.dq__null_check(dq_history.max_count IS NULL, 'max_count');
    SELECT
        h.queue::text, h.key::text, h.id, h.outcome, h.payload, h.state, nullif(h.channel, '')::text,
        h.priority, h.created_at, h.scheduled_at, h.last_leased_at, h.finished_at, h.attempts,
        h.last_error, h.headers
    FROM @extschema@.dq_queues AS q
    CROSS JOIN @extschema@.dq_now() AS n (now_at)
    CROSS JOIN LATERAL (
        (
            SELECT a.* FROM @extschema@.dq_history AS a
            WHERE dq_history.key IS NULL AND a.queue = q.queue
                AND a.finished_at >= @extschema@.dq__history_cut(q.history_keep, q.history_from, n.now_at)
            ORDER BY a.finished_at DESC, a.id DESC
            LIMIT greatest(dq_history.max_count, 0)
        )
        UNION ALL
        (
            SELECT k.* FROM @extschema@.dq_history AS k
            WHERE dq_history.key IS NOT NULL AND k.queue = q.queue AND k.key = dq_history.key
                AND k.finished_at >= @extschema@.dq__history_cut(q.history_keep, q.history_from, n.now_at)
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
    v_now timestamptz := @extschema@.dq_now();
    v_seconds numeric;
    v_width smallint;
    v_from timestamptz;
    v_buckets numeric;
    v_cut timestamptz;       -- records finished before it have aged out
    v_cut_second timestamptz;  -- the first whole second after it (or it)
    v_cut_width timestamptz;   -- the first whole tally after it (or it)
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_history_stats.queue);
    PERFORM @extschema@.dq__null_check(since IS NULL, 'since');
    PERFORM @extschema@.dq__null_check(bucket IS NULL, 'bucket');
    PERFORM @extschema@.dq__check_time(since, 'since');
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
        SELECT @extschema@.dq__history_cut(q.history_keep, q.history_from, v_now)
        FROM @extschema@.dq_queues AS q
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
        FROM @extschema@.dq_history_tallies AS t
        WHERE t.queue = dq_history_stats.queue AND t.width = v_width
            AND t.at >= v_from AND t.at >= v_cut_width
        UNION ALL
        -- the seconds before the first whole minute after the cut
        SELECT pg_catalog.date_bin(bucket, t.at, 'epoch') AS b, t.measure, t.bin, t.n
        FROM @extschema@.dq_history_tallies AS t
        WHERE v_width = 60 AND t.queue = dq_history_stats.queue AND t.width = 1
            AND t.at >= v_from AND t.at >= v_cut_second AND t.at < v_cut_width
        UNION ALL
        -- and the deltas not yet folded
        SELECT pg_catalog.date_bin(bucket, d.at, 'epoch'), d.measure, d.bin, d.n
        FROM @extschema@.dq_history_deltas AS d
        WHERE d.queue = dq_history_stats.queue AND d.at >= v_from
            AND d.at >= v_cut_second
        UNION ALL
        -- the records themselves between the cut and the first whole
        -- second after it
        SELECT pg_catalog.date_bin(bucket, r.finished_at, 'epoch'), m.measure,
            CASE m.measure
                WHEN 'l' THEN @extschema@.dq__duration_bin(r.lateness)
                WHEN 'r' THEN @extschema@.dq__duration_bin(r.finished_at - r.last_leased_at)
                ELSE 0::smallint
            END,
            1::bigint
        FROM @extschema@.dq_history AS r
        CROSS JOIN LATERAL @extschema@.dq__history_measures(r.outcome, r.last_leased_at) AS m (measure)
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
        SELECT u.bin, @extschema@.dq__bin_duration(u.bin) AS middle
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
    v_now timestamptz := @extschema@.dq_now();
    v_from timestamptz;
    v_cut timestamptz;         -- records finished before it have aged out
    v_cut_second timestamptz;  -- the first whole second after it (or it)
    v_cut_minute timestamptz;  -- the first whole minute after it (or it)
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_history_bins.queue);
    PERFORM @extschema@.dq__null_check(since IS NULL, 'since');
    PERFORM @extschema@.dq__check_time(since, 'since');
    v_from := pg_catalog.date_bin('1 minute', since, 'epoch');
    v_cut := (
        SELECT @extschema@.dq__history_cut(q.history_keep, q.history_from, v_now)
        FROM @extschema@.dq_queues AS q
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
        FROM @extschema@.dq_history_tallies AS t
        WHERE t.queue = dq_history_bins.queue AND t.width = 60 AND t.measure IN ('l', 'r')
            AND t.at >= v_from AND t.at >= v_cut_minute
        UNION ALL
        SELECT pg_catalog.date_bin('1 minute', t.at, 'epoch'), t.measure, t.bin, t.n
        FROM @extschema@.dq_history_tallies AS t
        WHERE t.queue = dq_history_bins.queue AND t.width = 1 AND t.measure IN ('l', 'r')
            AND t.at >= v_from AND t.at >= v_cut_second AND t.at < v_cut_minute
        UNION ALL
        SELECT pg_catalog.date_bin('1 minute', d.at, 'epoch'), d.measure, d.bin, d.n
        FROM @extschema@.dq_history_deltas AS d
        WHERE d.queue = dq_history_bins.queue AND d.measure IN ('l', 'r')
            AND d.at >= v_from AND d.at >= v_cut_second
        UNION ALL
        SELECT pg_catalog.date_bin('1 minute', r.finished_at, 'epoch'), m.measure,
            CASE m.measure
                WHEN 'l' THEN @extschema@.dq__duration_bin(r.lateness)
                ELSE @extschema@.dq__duration_bin(r.finished_at - r.last_leased_at)
            END,
            1::bigint
        FROM @extschema@.dq_history AS r
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
    v_now timestamptz := @extschema@.dq_now();
    v_from timestamptz;
    v_minutes numeric;
BEGIN
    PERFORM @extschema@.dq__null_check(since IS NULL, 'since');
    PERFORM @extschema@.dq__check_time(since, 'since');
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
            SELECT q.queue, @extschema@.dq__history_cut(q.history_keep, q.history_from, v_now) AS cut
            FROM @extschema@.dq_queues AS q
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
        INNER JOIN @extschema@.dq_history_tallies AS t
            ON t.queue = k.queue AND t.width = 60 AND t.at >= v_from AND t.at >= k.cut_minute
        UNION ALL
        SELECT k.queue, pg_catalog.date_bin('1 minute', t.at, 'epoch'), t.measure, t.bin, t.n
        FROM kept AS k
        INNER JOIN @extschema@.dq_history_tallies AS t
            ON t.queue = k.queue AND t.width = 1 AND t.at >= v_from AND t.at >= k.cut_second
                AND t.at < k.cut_minute
        UNION ALL
        SELECT k.queue, pg_catalog.date_bin('1 minute', d.at, 'epoch'), d.measure, d.bin, d.n
        FROM kept AS k
        INNER JOIN @extschema@.dq_history_deltas AS d
            ON d.queue = k.queue AND d.at >= v_from AND d.at >= k.cut_second
        UNION ALL
        SELECT k.queue, pg_catalog.date_bin('1 minute', r.finished_at, 'epoch'), m.measure,
            CASE m.measure
                WHEN 'l' THEN @extschema@.dq__duration_bin(r.lateness)
                WHEN 'r' THEN @extschema@.dq__duration_bin(r.finished_at - r.last_leased_at)
                ELSE 0::smallint
            END,
            1::bigint
        FROM kept AS k
        INNER JOIN @extschema@.dq_history AS r
            ON r.queue = k.queue AND r.finished_at >= v_from AND r.finished_at >= k.cut
                AND r.finished_at < k.cut_second
        CROSS JOIN LATERAL @extschema@.dq__history_measures(r.outcome, r.last_leased_at) AS m (measure)
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
-- NULL for any other delete. (An expression without FROM, which the
-- planner inlines: as a query, each call ran the SQL function's executor,
-- 45 us of every recorded delete.)
CREATE FUNCTION dq__deleting_outcome() RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN pg_catalog.current_setting('dq.outcome', true) OPERATOR(pg_catalog.=) ANY (
            ARRAY['acked', 'dead', 'cancelled', 'purged']
        ) THEN pg_catalog.current_setting('dq.outcome', true)
    END
$$;

-- Whether deleting messages of queues (NULL: of any queue) may have to be
-- recorded: one of them keeps history, or (NULL) some queue does, or the
-- caller may not read every queue's settings (no SELECT on dq_queues, or
-- row-level security on it that could hide a queue's retention). The acks
-- count their own deletes only when not (12_counts.sql): the trigger that
-- records also counts. As the caller, who learns nothing it may not read; a
-- probe of dq_queues_retained per queue (NULL: one).
CREATE FUNCTION dq__may_keep_history(queues text[]) RETURNS boolean
LANGUAGE plpgsql STABLE
-- every name qualified instead of a SET search_path, which cost a third of
-- a call (4.5 us in every ack)
AS $$
BEGIN
    IF NOT pg_catalog.has_table_privilege('@extschema@.dq_queues', 'SELECT')
        OR pg_catalog.row_security_active('@extschema@.dq_queues'::pg_catalog.regclass) THEN
        RETURN TRUE;
    END IF;
    IF dq__may_keep_history.queues IS NULL THEN
        RETURN EXISTS (SELECT FROM @extschema@.dq_queues AS q WHERE q.retain IS NOT NULL);
    END IF;
    RETURN EXISTS (
        SELECT FROM @extschema@.dq_queues AS q
        WHERE q.queue OPERATOR(pg_catalog.=) ANY (dq__may_keep_history.queues) AND q.retain IS NOT NULL
    );
END
$$;
