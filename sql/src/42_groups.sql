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

-- "Never", for dq_groups' times: the last instant a Python datetime (and
-- most clients) can read, where 'infinity' cannot be. A lower bound there
-- stays one: nothing is due before it that it could hide.
CREATE FUNCTION dq__never() RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '9999-12-31 23:59:59+00'::pg_catalog.timestamptz $$;

-- Up to max_count due messages of one priority level of a group, after
-- position (after_due, after_id), in due order, locked; rows that others
-- hold are skipped. Level 0 of the unchanneled group is in dq_messages_due.
CREATE FUNCTION dq__level_heads(
    queue text,
    channel text,
    level integer,
    now_at timestamptz,
    max_count integer,
    after_due timestamptz,
    after_id bigint
) RETURNS TABLE (row_at tid, id bigint, priority integer, due_at timestamptz, attempts integer)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
AS $$
#variable_conflict use_column
BEGIN
    IF dq__level_heads.channel = '' AND level = 0 THEN
        RETURN QUERY
        SELECT m.ctid, m.id, m.priority, m.due_at, m.attempts
        FROM @extschema@.dq_messages AS m
        WHERE m.queue = dq__level_heads.queue AND m.channel = '' AND m.priority = 0
            AND m.due_at <= now_at
            AND (m.due_at, m.id) > (after_due, after_id)
        ORDER BY m.due_at, m.id
        LIMIT max_count
        FOR UPDATE SKIP LOCKED;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT m.ctid, m.id, m.priority, m.due_at, m.attempts
    FROM @extschema@.dq_messages AS m
    WHERE m.queue = dq__level_heads.queue AND m.channel = dq__level_heads.channel
        AND m.priority = level AND (m.channel <> '' OR m.priority <> 0)
        AND m.due_at <= now_at
        AND (m.due_at, m.id) > (after_due, after_id)
    ORDER BY m.due_at, m.id
    LIMIT max_count
    FOR UPDATE SKIP LOCKED;
END
$$;

-- The group's highest priority level below bound (NULL: none), counting
-- level 0 of the unchanneled group, whose messages are in dq_messages_due.
CREATE FUNCTION dq__level_below(queue text, channel text, bound bigint) RETURNS integer
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_level integer;
BEGIN
    v_level := (
        SELECT m.priority FROM @extschema@.dq_messages AS m
        WHERE m.queue = dq__level_below.queue AND m.channel = dq__level_below.channel
            AND (m.channel <> '' OR m.priority <> 0)
            AND m.priority < bound
        ORDER BY m.priority DESC
        LIMIT 1
    );
    IF dq__level_below.channel = '' AND bound > 0 AND coalesce(v_level < 0, TRUE)
        AND EXISTS (
            SELECT FROM @extschema@.dq_messages AS m
            WHERE m.queue = dq__level_below.queue AND m.channel = '' AND m.priority = 0
        ) THEN
        RETURN 0;
    END IF;
    RETURN v_level;
END
$$;

-- Up to max_count due messages of a group in delivery order (priority, due
-- time, id) after position (after_priority, after_due, after_id), locked;
-- rows that others hold are skipped. One probe per priority level the group
-- uses: the group's future messages are never read.
CREATE FUNCTION dq__group_heads(
    queue text,
    channel text,
    now_at timestamptz,
    max_count integer,
    after_priority integer DEFAULT NULL,  -- NULL: from the start
    after_due timestamptz DEFAULT '-infinity',
    after_id bigint DEFAULT 0
) RETURNS TABLE (row_at tid, id bigint, priority integer, due_at timestamptz, attempts integer)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_left integer := max_count;
    v_bound bigint := 2147483648;  -- above every integer
    v_level integer;
    v_found integer;
BEGIN
    IF after_priority IS NOT NULL THEN
        RETURN QUERY SELECT * FROM @extschema@.dq__level_heads(
            queue, channel, after_priority, now_at, v_left, after_due, after_id
        );
        GET DIAGNOSTICS v_found = ROW_COUNT;
        v_left := v_left - v_found;
        v_bound := after_priority;
    END IF;
    WHILE v_left > 0 LOOP
        v_level := @extschema@.dq__level_below(queue, channel, v_bound);
        EXIT WHEN v_level IS NULL;
        RETURN QUERY SELECT * FROM @extschema@.dq__level_heads(
            queue, channel, v_level, now_at, v_left, '-infinity', 0
        );
        GET DIAGNOSTICS v_found = ROW_COUNT;
        v_left := v_left - v_found;
        v_bound := v_level;
    END LOOP;
END
$$;

-- The earliest due time of a group's messages (leased ones by their
-- lease's end); NULL when it has none.
CREATE FUNCTION dq__group_first_due(queue text, channel text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_first timestamptz;
    v_bound bigint := 2147483648;
    v_level integer;
BEGIN
    LOOP
        v_level := @extschema@.dq__level_below(queue, channel, v_bound);
        EXIT WHEN v_level IS NULL;
        IF dq__group_first_due.channel = '' AND v_level = 0 THEN
            v_first := least(v_first, (
                SELECT m.due_at FROM @extschema@.dq_messages AS m
                WHERE m.queue = dq__group_first_due.queue AND m.channel = '' AND m.priority = 0
                ORDER BY m.due_at
                LIMIT 1
            ));
        ELSE
            v_first := least(v_first, (
                SELECT m.due_at FROM @extschema@.dq_messages AS m
                WHERE m.queue = dq__group_first_due.queue AND m.channel = dq__group_first_due.channel
                    AND m.priority = v_level AND (m.channel <> '' OR m.priority <> 0)
                ORDER BY m.due_at
                LIMIT 1
            ));
        END IF;
        v_bound := v_level;
    END LOOP;
    RETURN v_first;
END
$$;

-- How many of a channel's leases are valid at now_at, counting up to limit.
CREATE FUNCTION dq__leases_held(queue text, channel text, now_at timestamptz, limit_count integer) RETURNS integer
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
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
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
        AND @extschema@.dq__leases_held(queue, channel, now_at, max_concurrency) >= max_concurrency THEN
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
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
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
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
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
            AND @extschema@.dq__leases_held(v_queue, g.channel, now_at, g.max_concurrency) + t.f
                >= g.max_concurrency
            AND @extschema@.dq__group_first_due(v_queue, g.channel) <= now_at
    );
    IF cardinality(v_full) > 0 THEN
        PERFORM @extschema@.dq__wake(v_queue);
    END IF;
END
$$;

-- Up to max_count deliverable messages of a group after position
-- (after_priority, after_due, after_id), locked, in delivery order; the
-- spent ones met on the way (attempts >= max_attempts) come too, flagged.
CREATE FUNCTION dq__group_next(
    queue text,
    channel text,
    now_at timestamptz,
    max_count integer,
    max_attempts integer,
    after_priority integer DEFAULT NULL,
    after_due timestamptz DEFAULT '-infinity',
    after_id bigint DEFAULT 0
) RETURNS TABLE (row_at tid, id bigint, priority integer, due_at timestamptz, spent boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_left integer := max_count;
    v_head record;
    v_read integer;
BEGIN
    LOOP
        v_read := 0;
        FOR v_head IN
            SELECT * FROM @extschema@.dq__group_heads(
                queue, channel, now_at, v_left, after_priority, after_due, after_id
            )
        LOOP
            v_read := v_read + 1;
            row_at := v_head.row_at;
            id := v_head.id;
            priority := v_head.priority;
            due_at := v_head.due_at;
            spent := coalesce(v_head.attempts >= max_attempts, FALSE);
            RETURN NEXT;
            IF NOT spent THEN
                v_left := v_left - 1;
            END IF;
            after_priority := v_head.priority;
            after_due := v_head.due_at;
            after_id := v_head.id;
        END LOOP;
        EXIT WHEN v_left <= 0 OR v_read = 0;
    END LOOP;
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
-- from each group in turn order; later rounds go round the groups taken
-- from, in the same order, as the rule makes them come round again.
CREATE FUNCTION dq__poll_grouped(
    queue text,
    max_count integer,
    lease interval,
    now_at timestamptz,
    max_attempts integer
) RETURNS SETOF dq_delivery
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_queue text := dq__poll_grouped.queue;
    v_turn_order refcursor;
    v_group record;          -- the turn order's current group
    v_has_group boolean;
    v_plain_turn bigint;     -- the unchanneled group's turn, when this poll holds it
    v_plain_row tid;         -- and its next message: where, which, its priority and due time
    v_plain_id bigint;
    v_plain_priority integer;
    v_plain_due timestamptz;
    v_plain_waiting boolean; -- still to take its turn in the first round
    v_plain_first boolean;   -- and it comes before the turn order's current group
    v_head record;
    v_room integer;
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
    v_active boolean[] := '{}';
    v_left integer;
    v_each integer;
    v_got integer;
    v_round integer[] := '{}';
    v_turns regclass;        -- dq_turns
    v_turned text[];         -- the groups taken from, in the order of their last message
    v_turn_values bigint[];
    i integer;
BEGIN
    -- groups whose wake time has come are looked at again
    UPDATE @extschema@.dq_groups AS g
    SET wake_at = NULL
    FROM (
        SELECT w.channel FROM @extschema@.dq_groups AS w
        WHERE w.queue = v_queue AND w.wake_at <= now_at
        ORDER BY w.wake_at
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS woken
    WHERE g.queue = v_queue AND g.channel = woken.channel;

    -- the unchanneled group has no row in the turn order's index scan: its
    -- messages never put it to sleep, so its next one is read every time
    SELECT g.turn INTO v_plain_turn
    FROM @extschema@.dq_groups AS g
    WHERE g.queue = v_queue AND g.channel = ''
    FOR NO KEY UPDATE SKIP LOCKED;
    v_plain_waiting := FOUND;
    IF v_plain_waiting THEN
        -- Its next message, in one statement: its priority levels other
        -- than 0 (in dq_messages_grouped), then level 0 (in dq_messages_due)
        -- in its place, one probe each, highest first.
        WITH RECURSIVE levels (p) AS (
            (
                SELECT m.priority FROM @extschema@.dq_messages AS m
                WHERE m.queue = v_queue AND m.channel = '' AND m.priority <> 0
                ORDER BY m.priority DESC
                LIMIT 1
            )
            UNION ALL
            SELECT (
                SELECT m.priority FROM @extschema@.dq_messages AS m
                WHERE m.queue = v_queue AND m.channel = '' AND m.priority <> 0 AND m.priority < l.p
                ORDER BY m.priority DESC
                LIMIT 1
            )
            FROM levels AS l
            WHERE l.p IS NOT NULL
        ),

        every_level AS (
            SELECT l.p FROM levels AS l WHERE l.p IS NOT NULL
            UNION ALL
            SELECT 0
        )

        SELECT
            coalesce(hp.row_at, hg.row_at) AS row_at,
            coalesce(hp.id, hg.id) AS id,
            coalesce(hp.priority, hg.priority) AS priority,
            coalesce(hp.due_at, hg.due_at) AS due_at,
            coalesce(coalesce(hp.attempts, hg.attempts) >= max_attempts, FALSE) AS spent
        INTO v_head
        FROM (SELECT e.p FROM every_level AS e ORDER BY e.p DESC) AS l
        LEFT JOIN LATERAL (
            SELECT m.ctid AS row_at, m.id, m.priority, m.due_at, m.attempts
            FROM @extschema@.dq_messages AS m
            WHERE l.p = 0 AND m.queue = v_queue AND m.channel = '' AND m.priority = 0 AND m.due_at <= now_at
            ORDER BY m.due_at, m.id
            LIMIT 1
            FOR UPDATE SKIP LOCKED
        ) AS hp ON TRUE
        LEFT JOIN LATERAL (
            SELECT m.ctid AS row_at, m.id, m.priority, m.due_at, m.attempts
            FROM @extschema@.dq_messages AS m
            WHERE l.p <> 0 AND m.queue = v_queue AND m.channel = '' AND m.priority = l.p
                AND m.priority <> 0 AND m.due_at <= now_at
            ORDER BY m.due_at, m.id
            LIMIT 1
            FOR UPDATE SKIP LOCKED
        ) AS hg ON TRUE
        WHERE coalesce(hp.id, hg.id) IS NOT NULL
        LIMIT 1;
        IF v_head.spent THEN  -- already delivered max_attempts times: bury, take the next
            FOR v_head IN SELECT * FROM @extschema@.dq__group_next(v_queue, '', now_at, 1, max_attempts) LOOP
                EXIT WHEN NOT v_head.spent;
                v_spent := v_spent || v_head.id;
            END LOOP;
        END IF;
        IF v_head.id IS NOT NULL AND NOT v_head.spent THEN
            v_plain_row := v_head.row_at;
            v_plain_id := v_head.id;
            v_plain_priority := v_head.priority;
            v_plain_due := v_head.due_at;
        END IF;
        v_plain_waiting := v_plain_id IS NOT NULL;
    END IF;

    OPEN v_turn_order FOR
        SELECT g.channel, g.turn, g.first_due, g.max_concurrency, g.min_interval, g.last_leased_at
        FROM @extschema@.dq_groups AS g
        WHERE g.queue = v_queue AND g.wake_at IS NULL AND g.channel <> ''
        ORDER BY g.turn NULLS FIRST, g.first_due, g.channel
        FOR NO KEY UPDATE SKIP LOCKED;
    FETCH v_turn_order INTO v_group;
    v_has_group := FOUND;

    -- The first round: one message from each group, in turn order.
    WHILE cardinality(v_ids) < max_count AND (v_has_group OR v_plain_waiting) LOOP
        IF v_plain_waiting AND NOT v_has_group THEN
            v_plain_first := TRUE;
        ELSIF v_plain_waiting THEN
            v_plain_first := @extschema@.dq__unchanneled_first(
                v_plain_turn, v_plain_due, v_group.turn, v_group.first_due
            );
        ELSE
            v_plain_first := FALSE;
        END IF;
        IF v_plain_first THEN
            v_rows := v_rows || v_plain_row;
            v_ids := v_ids || v_plain_id;
            v_groups := v_groups || ''::text;
            v_rounds := v_rounds || 1;
            v_taken_from := v_taken_from || ''::text;
            v_room_left := v_room_left || NULL::integer;
            v_after_priority := v_after_priority || v_plain_priority;
            v_after_due := v_after_due || v_plain_due;
            v_after_id := v_after_id || v_plain_id;
            v_plain_waiting := FALSE;
            CONTINUE;
        END IF;

        v_head := NULL;
        v_room := NULL;
        IF v_group.max_concurrency IS NOT NULL OR v_group.min_interval IS NOT NULL THEN
            v_room := @extschema@.dq__group_room(
                v_group.max_concurrency, v_group.min_interval, v_group.last_leased_at,
                CASE WHEN v_group.max_concurrency IS NOT NULL THEN
                    @extschema@.dq__leases_held(v_queue, v_group.channel, now_at, v_group.max_concurrency)
                END,
                now_at
            );
        END IF;
        IF coalesce(v_room > 0, TRUE) THEN
            -- The channel's next message, in one statement: one probe per
            -- priority level it uses (the hot path of a poll; dq__group_next
            -- is the same, step by step, for what this cannot do).
            WITH RECURSIVE levels (p) AS (
                (
                    SELECT m.priority FROM @extschema@.dq_messages AS m
                    WHERE m.queue = v_queue AND m.channel = v_group.channel AND m.channel <> ''
                    ORDER BY m.priority DESC
                    LIMIT 1
                )
                UNION ALL
                SELECT (
                    SELECT m.priority FROM @extschema@.dq_messages AS m
                    WHERE m.queue = v_queue AND m.channel = v_group.channel AND m.channel <> ''
                        AND m.priority < l.p
                    ORDER BY m.priority DESC
                    LIMIT 1
                )
                FROM levels AS l
                WHERE l.p IS NOT NULL
            )

            SELECT h.row_at, h.id, h.priority, h.due_at, coalesce(h.attempts >= max_attempts, FALSE) AS spent
            INTO v_head
            FROM levels AS l
            CROSS JOIN LATERAL (
                SELECT m.ctid AS row_at, m.id, m.priority, m.due_at, m.attempts
                FROM @extschema@.dq_messages AS m
                WHERE m.queue = v_queue AND m.channel = v_group.channel AND m.channel <> ''
                    AND m.priority = l.p AND m.due_at <= now_at
                ORDER BY m.due_at, m.id
                LIMIT 1
                FOR UPDATE SKIP LOCKED
            ) AS h
            WHERE l.p IS NOT NULL
            LIMIT 1;
            IF v_head.spent THEN  -- already delivered max_attempts times: bury, take the next
                v_head := NULL;
                FOR v_head IN
                    SELECT * FROM @extschema@.dq__group_next(v_queue, v_group.channel, now_at, 1, max_attempts)
                LOOP
                    EXIT WHEN NOT v_head.spent;
                    v_spent := v_spent || v_head.id;
                END LOOP;
                IF v_head.spent THEN
                    v_head := NULL;
                END IF;
            END IF;
        END IF;

        IF v_head IS NULL THEN
            -- nothing eligible: it sleeps until it could have something
            PERFORM @extschema@.dq__group_rest(v_queue, v_group.channel, now_at);
        ELSIF v_group.turn IS NULL AND v_head.due_at > v_group.first_due THEN
            -- never leased from, and placed too early (its earliest message
            -- went): place it right and read the turn order again
            UPDATE @extschema@.dq_groups AS g
            SET first_due = v_head.due_at
            WHERE g.queue = v_queue AND g.channel = v_group.channel;
            CLOSE v_turn_order;
            OPEN v_turn_order FOR
                SELECT g.channel, g.turn, g.first_due, g.max_concurrency, g.min_interval, g.last_leased_at
                FROM @extschema@.dq_groups AS g
                WHERE g.queue = v_queue AND g.wake_at IS NULL AND g.channel <> ''
                    AND g.channel <> ALL(v_visited)
                ORDER BY g.turn NULLS FIRST, g.first_due, g.channel
                FOR NO KEY UPDATE SKIP LOCKED;
            FETCH v_turn_order INTO v_group;
            v_has_group := FOUND;
            CONTINUE;
        ELSE
            v_rows := v_rows || v_head.row_at;
            v_ids := v_ids || v_head.id;
            v_groups := v_groups || v_group.channel;
            v_rounds := v_rounds || 1;
            v_taken_from := v_taken_from || v_group.channel;
            v_room_left := v_room_left || (v_room - 1);
            v_after_priority := v_after_priority || v_head.priority;
            v_after_due := v_after_due || v_head.due_at;
            v_after_id := v_after_id || v_head.id;
        END IF;
        v_visited := v_visited || v_group.channel;
        FETCH v_turn_order INTO v_group;
        v_has_group := FOUND;
    END LOOP;
    CLOSE v_turn_order;

    -- Later rounds: the groups taken from come round again in the same
    -- order. Each pass asks every group with room for an equal share of
    -- what is left; a group that gives less is done.
    v_active := array_fill(TRUE, ARRAY[cardinality(v_taken_from)]);
    v_round := array_fill(1, ARRAY[cardinality(v_taken_from)]);
    LOOP
        v_left := max_count - cardinality(v_ids);
        EXIT WHEN v_left <= 0 OR NOT TRUE = ANY(v_active);
        v_each := ceil(v_left::numeric / (SELECT count(*) FROM unnest(v_active) AS a (a) WHERE a.a));
        FOR i IN 1 .. cardinality(v_taken_from) LOOP
            CONTINUE WHEN NOT v_active[i];
            v_got := 0;
            IF coalesce(v_room_left[i] > 0, TRUE) THEN
                FOR v_head IN
                    SELECT * FROM @extschema@.dq__group_next(
                        v_queue, v_taken_from[i], now_at, least(v_each, v_room_left[i]), max_attempts,
                        v_after_priority[i], v_after_due[i], v_after_id[i]
                    )
                LOOP
                    v_after_priority[i] := v_head.priority;
                    v_after_due[i] := v_head.due_at;
                    v_after_id[i] := v_head.id;
                    IF v_head.spent THEN
                        v_spent := v_spent || v_head.id;
                        CONTINUE;
                    END IF;
                    v_got := v_got + 1;
                    v_round[i] := v_round[i] + 1;
                    v_rows := v_rows || v_head.row_at;
                    v_ids := v_ids || v_head.id;
                    v_groups := v_groups || v_taken_from[i];
                    v_rounds := v_rounds || v_round[i];
                END LOOP;
                v_room_left[i] := v_room_left[i] - v_got;
            END IF;
            v_active[i] := v_got > 0 AND v_got = least(v_each, v_room_left[i] + v_got);
        END LOOP;
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
            lock_token = @extschema@.dq__token(m.id),
            due_at = now_at + lease
        FROM unnest(v_rows) WITH ORDINALITY AS picked (row_at, pos)
        WHERE m.ctid = picked.row_at
        RETURNING
            picked.pos,
            m.id, m.queue, m.key, m.payload, m.state, m.scheduled_at,
            m.created_at, m.attempts, m.lock_token, m.due_at, m.channel, m.priority
    )

    SELECT
        l.id, l.queue::text, l.key::text, l.payload, l.state, l.scheduled_at,
        l.created_at, l.attempts, l.attempts > 1, l.lock_token, l.due_at,
        nullif(l.channel, '')::text, l.priority
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
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
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
AS $$
BEGIN
    IF written_at <= coalesce(@extschema@.dq__grouped_next_due(queue, now_at, written_at), 'infinity') THEN
        PERFORM @extschema@.dq__wake(queue);
    END IF;
END
$$;
