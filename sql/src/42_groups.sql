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
            SELECT m.due_at FROM @extschema@.dq_messages AS m
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
            SELECT m.priority, m.due_at FROM @extschema@.dq_messages AS m
            WHERE m.queue OPERATOR(pg_catalog.=) dq__levels.queue
                AND m.channel OPERATOR(pg_catalog.=) dq__levels.channel
                AND (m.channel OPERATOR(pg_catalog.<>) '' OR m.priority OPERATOR(pg_catalog.<>) 0)
                AND m.priority OPERATOR(pg_catalog.<=) coalesce(at_most, 2147483647)
            ORDER BY m.priority DESC, m.due_at, m.id
            LIMIT 1
        ) AS g ON TRUE
        CROSS JOIN LATERAL @extschema@.dq__level_zero(
            dq__levels.queue, dq__levels.channel, coalesce(at_most, 0) OPERATOR(pg_catalog.>=) 0, g.priority
        ) AS z
        UNION ALL
        SELECT
            CASE WHEN z.zero THEN 0 ELSE g.priority END,
            CASE WHEN z.zero THEN z.plain_due ELSE g.due_at END
        FROM levels AS l
        LEFT JOIN LATERAL (
            SELECT m.priority, m.due_at FROM @extschema@.dq_messages AS m
            WHERE m.queue OPERATOR(pg_catalog.=) dq__levels.queue
                AND m.channel OPERATOR(pg_catalog.=) dq__levels.channel
                AND (m.channel OPERATOR(pg_catalog.<>) '' OR m.priority OPERATOR(pg_catalog.<>) 0)
                AND m.priority OPERATOR(pg_catalog.<) l.p
            ORDER BY m.priority DESC, m.due_at, m.id
            LIMIT 1
        ) AS g ON TRUE
        CROSS JOIN LATERAL @extschema@.dq__level_zero(
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
        FROM @extschema@.dq__levels(dq__heads.queue, t.c, t.ap) AS l (p, d)
        LEFT JOIN LATERAL (
            SELECT m.ctid AS row_at, m.id, m.priority, m.due_at, m.attempts
            FROM @extschema@.dq_messages AS m
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
            FROM @extschema@.dq_messages AS m
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
        FROM @extschema@.dq__heads(
            queue, ARRAY[channel], '{1}', ARRAY[priority], ARRAY[due_at], ARRAY[id], now_at, max_attempts
        ) AS h;
        IF v_spent THEN
            PERFORM @extschema@.dq__bury(ARRAY[id], NULL::text, now_at, max_attempts);
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
        FROM @extschema@.dq__levels(dq__group_first_due.queue, dq__group_first_due.channel, NULL) AS l
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
        SELECT FROM @extschema@.dq_messages AS m
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
    v_at timestamptz := @extschema@.dq__group_first_due(queue, channel);
BEGIN
    IF v_at IS NULL THEN
        RETURN NULL;
    END IF;
    v_at := greatest(v_at, last_leased_at + min_interval);
    IF max_concurrency IS NOT NULL
        AND (SELECT h.held FROM @extschema@.dq__leases_held(queue, channel, now_at, max_concurrency) AS h)
            >= max_concurrency THEN
        v_at := greatest(v_at, (
            SELECT m.due_at FROM @extschema@.dq_messages AS m
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
    FROM @extschema@.dq_groups AS g
    WHERE g.queue = dq__group_rest.queue AND g.channel = dq__group_rest.channel
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;  -- a writer is at it: it stays awake
    END IF;
    v_next := @extschema@.dq__group_next_eligible(
        queue, channel, v_group.max_concurrency, v_group.min_interval, v_group.last_leased_at, now_at
    );
    IF v_next IS NULL AND v_group.max_concurrency IS NULL AND v_group.min_interval IS NULL THEN
        DELETE FROM @extschema@.dq_groups AS g
        WHERE g.queue = dq__group_rest.queue AND g.channel = dq__group_rest.channel;
    ELSIF coalesce(v_next > now_at, TRUE) THEN
        UPDATE @extschema@.dq_groups AS g
        SET wake_at = coalesce(v_next, @extschema@.dq__never()),
            first_due = coalesce(@extschema@.dq__group_first_due(queue, channel), g.first_due)
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
        INSERT INTO @extschema@.dq_groups AS g (queue, channel, first_due, wake_at)
        SELECT v_queue, n.c, coalesce(n.d, now_at), CASE WHEN n.d > now_at THEN n.d END
        FROM (
            SELECT '' AS c, now_at AS d
            UNION ALL
            SELECT t.c, t.d FROM unnest(v_channels, v_dues) AS t (c, d) WHERE t.d IS NOT NULL
        ) AS n
        ORDER BY n.c COLLATE "C"
        ON CONFLICT ON CONSTRAINT dq_groups_pkey DO NOTHING;
        v_locked := ARRAY(
            SELECT g.channel FROM @extschema@.dq_groups AS g
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
        FROM @extschema@.dq_groups AS g
        INNER JOIN unnest(v_channels, v_dues, v_freed) AS t (c, d, f) ON g.channel = t.c
        WHERE g.queue = v_queue
            AND (
                g.wake_at > least(t.d, CASE WHEN t.f > 0 AND g.max_concurrency IS NOT NULL THEN now_at END)
                OR (g.turn IS NULL AND g.first_due > t.d)
            )
        ORDER BY g.channel
        FOR NO KEY UPDATE OF g
    )

    UPDATE @extschema@.dq_groups AS g
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
        SELECT g.channel FROM @extschema@.dq_groups AS g
        INNER JOIN unnest(v_channels, v_freed) AS t (c, f) ON g.channel = t.c
        WHERE g.queue = v_queue AND t.f > 0 AND g.max_concurrency IS NOT NULL
            AND (SELECT h.held FROM @extschema@.dq__leases_held(v_queue, g.channel, now_at, g.max_concurrency) AS h)
                + t.f
                >= g.max_concurrency
            -- dq__group_first_due, inlined: a call per channel cost its
            -- settings' save and restore, more than its probes
            AND (SELECT min(l.first_due) FROM @extschema@.dq__levels(v_queue, g.channel, NULL) AS l) <= now_at
    );
    IF cardinality(v_full) > 0 THEN
        PERFORM @extschema@.dq__wake(v_queue);
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
    v_batch @extschema@.dq_groups[];
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
    UPDATE @extschema@.dq_groups AS g
    SET wake_at = NULL
    WHERE g.ctid = ANY(ARRAY(
        SELECT w.ctid FROM @extschema@.dq_groups AS w
        WHERE w.queue = v_queue AND w.wake_at <= now_at
        ORDER BY w.wake_at
        FOR NO KEY UPDATE SKIP LOCKED
    ));

    -- the unchanneled group has no row in the turn order's index scan: its
    -- messages never put it to sleep, so its next one is read every time
    SELECT g.turn INTO v_plain_turn
    FROM @extschema@.dq_groups AS g
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
            SELECT g FROM @extschema@.dq_groups AS g
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
            SELECT b.ordinality AS o, b.channel, @extschema@.dq__group_room(
                b.max_concurrency, b.min_interval, b.last_leased_at,
                CASE WHEN b.max_concurrency IS NOT NULL THEN
                    (SELECT h.held FROM @extschema@.dq__leases_held(v_queue, b.channel, now_at, b.max_concurrency) AS h)
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
        LEFT JOIN @extschema@.dq__heads(
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
                v_plain := @extschema@.dq__group_first(v_queue, '', now_at, max_attempts);
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
                ELSE @extschema@.dq__unchanneled_first(
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
                    v_head := @extschema@.dq__group_first(v_queue, (v_batch[i]).channel, now_at, max_attempts);
                ELSE
                    SELECT v_h.row_at[i] AS row_at, v_h.id[i] AS id, v_h.priority[i] AS priority,
                        v_h.due_at[i] AS due_at
                    INTO v_head;
                END IF;
                IF v_head.id IS NULL THEN
                    -- nothing eligible: it sleeps until it could have something
                    PERFORM @extschema@.dq__group_rest(v_queue, (v_batch[i]).channel, now_at);
                ELSIF (v_batch[i]).turn IS NULL AND v_head.due_at > (v_batch[i]).first_due THEN
                    -- never leased from, and placed too early (its earliest message
                    -- went): place it right and read the turn order again
                    UPDATE @extschema@.dq_groups AS g
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
            SELECT * FROM @extschema@.dq__heads(
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
        PERFORM @extschema@.dq__bury(v_spent, NULL::text, now_at, max_attempts);
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
    v_turns := (SELECT sq.tableoid FROM @extschema@.dq_turns AS sq);
    -- ascending, one per group, in that order (generate_series gives them in order)
    v_turn_values := ARRAY(SELECT pg_catalog.nextval(v_turns) FROM generate_series(1, cardinality(v_turned)));
    UPDATE @extschema@.dq_groups AS g
    SET turn = t.turn,
        last_leased_at = now_at,
        wake_at = now_at + g.min_interval
    FROM unnest(v_turned, v_turn_values) AS t (grp, turn)
    WHERE g.queue = v_queue AND g.channel = ANY(v_turned) AND g.channel = t.grp;

    -- The rows stay locked by this transaction, so their addresses (ctid)
    -- still find them.
    RETURN QUERY
    WITH leased AS (
        UPDATE @extschema@.dq_messages AS m
        SET attempts = m.attempts + 1,
            lock_token = @extschema@.dq__token(m.id, (SELECT @extschema@.dq__token_proof())),
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
    v_best timestamptz := @extschema@.dq__group_first_due(queue, '');
    v_group record;
BEGIN
    IF v_best < v_stop THEN
        RETURN v_best;
    END IF;
    FOR v_group IN
        -- awake, or whose wake time has passed: read as they are now
        SELECT g.channel, g.max_concurrency, g.min_interval, g.last_leased_at, NULL AS wake_at
        FROM @extschema@.dq_groups AS g
        WHERE g.queue = dq__grouped_next_due.queue AND g.channel <> '' AND g.wake_at IS NULL
        UNION ALL
        (
            SELECT g.channel, g.max_concurrency, g.min_interval, g.last_leased_at,
                CASE WHEN g.wake_at > now_at THEN g.wake_at END
            FROM @extschema@.dq_groups AS g
            WHERE g.queue = dq__grouped_next_due.queue AND g.wake_at IS NOT NULL
            ORDER BY g.wake_at
        )
    LOOP
        EXIT WHEN v_group.wake_at >= v_best;
        v_best := least(v_best, @extschema@.dq__group_next_eligible(
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
    IF written_at <= coalesce(@extschema@.dq__grouped_next_due(queue, now_at, written_at), 'infinity') THEN
        PERFORM @extschema@.dq__wake(queue);
    END IF;
END
$$;
