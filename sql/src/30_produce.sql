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
        SELECT m.due_at FROM @extschema@.dq_messages AS m
        WHERE m.queue OPERATOR(pg_catalog.=) dq__wake_if_head.queue
            AND m.channel OPERATOR(pg_catalog.=) '' AND m.priority OPERATOR(pg_catalog.=) 0
        ORDER BY m.due_at
        LIMIT 1
    ) THEN
        PERFORM @extschema@.dq__wake(queue);
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
    v_now timestamptz := @extschema@.dq_now();
    v_at timestamptz := coalesce(dq_offer.scheduled_at, v_now);
    v_channel text := coalesce(dq_offer.channel, '');
    v_priority integer := coalesce(dq_offer.priority, 0);
    v_inserted boolean;
    v_counting boolean := FALSE;  -- dq__counting_inline's: false, the trigger counts
BEGIN
    -- one cheap test on the hot path; the checks say what is wrong
    IF NOT @extschema@.dq__valid_queue(dq_offer.queue)
        OR NOT @extschema@.dq__valid_key(dq_offer.key)
        OR dq_offer.payload IS NULL
        OR dq_offer.can_update IS NULL
        OR NOT @extschema@.dq__valid_time(dq_offer.scheduled_at)
        OR NOT @extschema@.dq__valid_channel(dq_offer.channel)
        OR NOT @extschema@.dq__valid_headers(dq_offer.headers) THEN
        PERFORM @extschema@.dq__check_queue(dq_offer.queue);
        PERFORM @extschema@.dq__check_key(dq_offer.key, 'key');
        PERFORM @extschema@.dq__null_check(dq_offer.payload IS NULL, 'payload');
        PERFORM @extschema@.dq__null_check(dq_offer.can_update IS NULL, 'can_update');
        PERFORM @extschema@.dq__check_time(dq_offer.scheduled_at, 'scheduled_at');
        PERFORM @extschema@.dq__check_channel(dq_offer.channel, 'channel');
        PERFORM @extschema@.dq__check_headers(dq_offer.headers, 'headers');
    END IF;

    -- A new key first: a plain insert, counted here, which an existing key
    -- leaves alone (no update, so no update trigger: a third of a created
    -- offer's time). Concurrent offers of one new key wait for each other's
    -- insert: one creates, the others go on below.
    v_counting := @extschema@.dq__counting_inline();
    WITH created AS (
        INSERT INTO @extschema@.dq_messages AS m (
            queue, key, payload, scheduled_at, due_at, created_at, channel, priority, headers
        )
        VALUES (dq_offer.queue, dq_offer.key, dq_offer.payload, v_at, v_at, v_now, v_channel, v_priority, dq_offer.headers)
        ON CONFLICT (queue, key) WHERE key IS NOT NULL DO NOTHING
        RETURNING m.queue, m.due_at
    ),
    counted AS (
        INSERT INTO @extschema@.dq_counts (queue, due_bin, leased, n)
        SELECT c.queue, @extschema@.dq__due_bin(c.due_at), FALSE, 1
        FROM created AS c
        WHERE v_counting
    )
    SELECT TRUE INTO v_inserted FROM created AS c;
    v_counting := @extschema@.dq__counted_inline(v_counting);
    IF v_inserted IS NULL THEN
        -- ON CONFLICT makes concurrent offers of one key wait for each other
        -- instead of failing: one creates, the others update or ignore.
        -- (Headers take no part in the decision: an update replaces them.) A
        -- created message is counted here, an updated one by the trigger
        -- (12_counts.sql: only it knows the version the update replaced).
        v_counting := @extschema@.dq__counting_inline(inserts_only => TRUE);
        WITH offered AS (
            INSERT INTO @extschema@.dq_messages AS m (
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
                    AND NOT @extschema@.dq__same_offer(
                        m.payload, m.scheduled_at, m.channel, m.priority,
                        excluded.payload, dq_offer.scheduled_at, excluded.channel, excluded.priority
                    )
            -- xmax is 0 on a fresh insert (an update by ON CONFLICT leaves its
            -- locker's): what the result says, and what is counted here
            RETURNING m.xmax = 0 AS created, m.queue, m.due_at
        ),
        counted AS (
            INSERT INTO @extschema@.dq_counts (queue, due_bin, leased, n)
            SELECT o.queue, @extschema@.dq__due_bin(o.due_at), FALSE, 1
            FROM offered AS o
            WHERE o.created AND v_counting
        )
        SELECT o.created INTO v_inserted FROM offered AS o;
        v_counting := @extschema@.dq__counted_inline(v_counting);
    END IF;
    IF v_inserted IS NULL THEN
        -- The message moves to another channel (the row is locked by now):
        -- dq_offer_many's replay also frees the slot it held in the old one.
        IF dq_offer.can_update AND EXISTS (
            SELECT FROM @extschema@.dq_messages AS m
            WHERE m.queue = dq_offer.queue AND m.key = dq_offer.key AND m.channel <> v_channel
        ) THEN
            RETURN (
                SELECT o.outcome FROM @extschema@.dq_offer_many(
                    dq_offer.queue, ARRAY[dq_offer.key], ARRAY[dq_offer.payload], ARRAY[dq_offer.scheduled_at],
                    TRUE, ARRAY[dq_offer.channel], ARRAY[v_priority], ARRAY[dq_offer.headers]
                ) AS o
            );
        END IF;
        RETURN 'ignored';
    END IF;
    IF v_channel = '' AND v_priority = 0 THEN
        PERFORM @extschema@.dq__wake_if_head(dq_offer.queue, v_at);
    ELSE
        -- an update drops any lease: its slot may be free
        PERFORM @extschema@.dq__groups_touch(
            dq_offer.queue, ARRAY[v_channel], ARRAY[v_at], ARRAY[NOT v_inserted], v_now
        );
        PERFORM @extschema@.dq__wake_if_first(dq_offer.queue, v_at, v_now);
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
                WHEN @extschema@.dq__same_offer(
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
    PERFORM @extschema@.dq__null_check(keys IS NULL, 'keys');
    PERFORM @extschema@.dq__null_check(payloads IS NULL, 'payloads');
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
    PERFORM @extschema@.dq__check_elements(pg_catalog.array_position(keys, NULL), keys IS NULL, 'keys');
    PERFORM @extschema@.dq__check_elements(pg_catalog.array_position(payloads, NULL), payloads IS NULL, 'payloads');
    PERFORM @extschema@.dq__check_time_elements(scheduled_ats, 'scheduled_ats');
    -- elements named by position, whatever the arrays' lower bounds
    SELECT k.k, k.ord INTO v_bad
    FROM unnest(keys) WITH ORDINALITY AS k (k, ord)
    WHERE NOT @extschema@.dq__valid_key(k.k)
    ORDER BY k.ord
    LIMIT 1;
    IF v_bad.ord IS NOT NULL THEN
        PERFORM @extschema@.dq__check_key(v_bad.k, format('keys[%s]', v_bad.ord));
    END IF;
    IF cardinality(headers) <> cardinality(keys) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format(
                'pgdq: headers must be NULL or have as many elements as keys (%s), got %s',
                cardinality(keys), cardinality(headers)
            );
    END IF;
    PERFORM @extschema@.dq__check_channel_elements(channels);
    PERFORM @extschema@.dq__check_headers_elements(headers);
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
    WHERE NOT @extschema@.dq__valid_channel(c.c)
    ORDER BY c.ord
    LIMIT 1;
    IF v_bad.ord IS NOT NULL THEN
        PERFORM @extschema@.dq__check_channel(v_bad.c, format('channels[%s]', v_bad.ord));
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
DECLARE
    v_counting boolean := FALSE;  -- dq__counting_inline's: false, the trigger counts
BEGIN
    -- the messages and their counts in one statement (12_counts.sql)
    v_counting := @extschema@.dq__counting_inline();
    WITH offered AS (
        INSERT INTO @extschema@.dq_messages AS m (
            queue, key, payload, scheduled_at, due_at, created_at, channel, priority, headers
        )
        SELECT
            dq__offer_new.queue, e.k, e.p,
            coalesce(e.s, now_at), coalesce(e.s, now_at), now_at,
            coalesce(e.c, ''), coalesce(e.pr, 0), e.h
        FROM unnest(keys, payloads, scheduled_ats, channels, priorities, headers) AS e (k, p, s, c, pr, h)
        ORDER BY e.k COLLATE "C"
        RETURNING m.queue, m.due_at
    )
    INSERT INTO @extschema@.dq_counts (queue, due_bin, leased, n)
    SELECT o.queue, @extschema@.dq__due_bin(o.due_at), FALSE, count(*)
    FROM offered AS o
    WHERE v_counting
    GROUP BY 1, 2;
    v_counting := @extschema@.dq__counted_inline(v_counting);
    RETURN TRUE;
EXCEPTION WHEN unique_violation THEN  -- a key exists or repeats: undone (the mark too)
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
        PERFORM @extschema@.dq__wake_if_head(queue, v_plain_first);
    END IF;
    IF v_channels IS NOT NULL THEN
        -- an update drops any lease: its slot may be free
        PERFORM @extschema@.dq__groups_touch(queue, v_channels, v_dues, v_updated, now_at);
    END IF;
    IF v_grouped_first IS NOT NULL THEN
        PERFORM @extschema@.dq__wake_if_first(queue, v_grouped_first, now_at);
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
    v_now timestamptz := @extschema@.dq_now();
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
    PERFORM @extschema@.dq__check_queue(v_queue);
    PERFORM @extschema@.dq__null_check(can_update IS NULL, 'can_update');
    PERFORM @extschema@.dq__check_offer_arrays(
        keys, payloads, scheduled_ats, channels, priorities, dq_offer_many.headers
    );

    -- The fast path runs in a subtransaction (its EXCEPTION block), so only
    -- a transaction's first write takes it: a transaction never holds more
    -- than one of pgdq's, far below the 64 a backend caches (past them every
    -- other session's snapshots slow down until the transaction ends).
    IF pg_current_xact_id_if_assigned() IS NULL
        AND @extschema@.dq__offer_new(
            v_queue, keys, payloads, scheduled_ats, channels, priorities, dq_offer_many.headers, v_now
        ) THEN
        IF cardinality(keys) > 0 AND channels IS NULL AND priorities IS NULL THEN
            PERFORM @extschema@.dq__wake_if_head(v_queue, CASE
                WHEN scheduled_ats IS NULL THEN v_now
                ELSE (SELECT min(coalesce(s.s, v_now)) FROM unnest(scheduled_ats) AS s (s))
            END);
        ELSIF cardinality(keys) > 0 THEN
            PERFORM @extschema@.dq__offers_written(
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
        FROM @extschema@.dq__offer_chain(
            keys, payloads, scheduled_ats, channels, priorities, dq_offer_many.headers, can_update, v_now,
            NULL::text[], NULL::jsonb[], NULL::timestamptz[], NULL::text[], NULL::integer[], NULL::jsonb[]
        ) AS c
        WHERE NOT v_distinct AND c.is_last
    ),

    inserted AS (
        INSERT INTO @extschema@.dq_messages AS m (
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
            array_agg(@extschema@.dq__is_leased(m.lock_token, m.due_at, v_now))
        INTO v_stored_keys, v_stored_payloads, v_stored_ats, v_stored_channels, v_stored_priorities,
            v_stored_headers, v_stored_leased
        FROM @extschema@.dq_messages AS m
        INNER JOIN unnest(v_keys) AS p (k) ON m.key = p.k
        WHERE m.queue = v_queue
            AND NOT EXISTS (SELECT FROM unnest(v_new) AS n (k) WHERE n.k = m.key);
    END IF;

    IF cardinality(v_stored_keys) > 0 THEN
        WITH updated AS (
            UPDATE @extschema@.dq_messages AS m
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
            FROM @extschema@.dq__offer_chain(
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
        PERFORM @extschema@.dq__wake_if_head(v_queue, v_first_at);  -- plain messages only
    ELSIF cardinality(v_dues) > 0 THEN
        PERFORM @extschema@.dq__offers_written(v_queue, v_channels, v_priorities, v_dues, v_updated, v_now);
    END IF;

    IF v_distinct AND cardinality(v_stored_keys) = 0 THEN
        RETURN QUERY SELECT k.k, 'created'::text FROM unnest(keys) AS k (k);
        RETURN;
    END IF;
    RETURN QUERY
    SELECT c.elem_key::text, c.outcome
    FROM @extschema@.dq__offer_chain(
        keys, payloads, scheduled_ats, channels, priorities, dq_offer_many.headers, can_update, v_now,
        v_stored_keys, v_stored_payloads, v_stored_ats, v_stored_channels, v_stored_priorities,
        v_stored_headers
    ) AS c
    WHERE c.elem_ord > 0
    ORDER BY c.elem_ord;
END
$$;
