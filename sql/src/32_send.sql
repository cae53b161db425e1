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
    IF NOT @extschema@.dq__valid_headers(headers) THEN
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
    PERFORM @extschema@.dq__null_check(payloads IS NULL, 'payloads');
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
    PERFORM @extschema@.dq__check_elements(pg_catalog.array_position(payloads, NULL), FALSE, 'payloads');
    PERFORM @extschema@.dq__check_time_elements(scheduled_ats, 'scheduled_ats');
    PERFORM @extschema@.dq__check_channel_elements(channels);
    PERFORM @extschema@.dq__check_headers_elements(headers);
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
    WHERE NOT @extschema@.dq__valid_headers(h.h)
    ORDER BY h.ord
    LIMIT 1;
    IF v_bad.ord IS NOT NULL THEN
        PERFORM @extschema@.dq__check_headers(v_bad.h, format('headers[%s]', v_bad.ord));
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
    v_now timestamptz := @extschema@.dq_now();
    v_at timestamptz := coalesce(dq_send.scheduled_at, v_now);
    v_channel text := coalesce(dq_send.channel, '');
    v_priority integer := coalesce(dq_send.priority, 0);
    v_id bigint;
    v_counting boolean := FALSE;  -- dq__counting_inline's: false, the trigger counts
BEGIN
    -- one cheap test on the hot path; the checks say what is wrong
    IF NOT @extschema@.dq__valid_queue(dq_send.queue)
        OR dq_send.payload IS NULL
        OR NOT @extschema@.dq__valid_time(dq_send.scheduled_at)
        OR NOT @extschema@.dq__valid_channel(dq_send.channel)
        OR NOT @extschema@.dq__valid_headers(dq_send.headers) THEN
        PERFORM @extschema@.dq__check_queue(dq_send.queue);
        PERFORM @extschema@.dq__null_check(dq_send.payload IS NULL, 'payload');
        PERFORM @extschema@.dq__check_time(dq_send.scheduled_at, 'scheduled_at');
        PERFORM @extschema@.dq__check_channel(dq_send.channel, 'channel');
        PERFORM @extschema@.dq__check_headers(dq_send.headers, 'headers');
    END IF;
    -- the message and its count in one statement (12_counts.sql)
    v_counting := @extschema@.dq__counting_inline();
    WITH sent AS (
        INSERT INTO @extschema@.dq_messages AS m (
            queue, payload, scheduled_at, due_at, created_at, channel, priority, headers
        )
        VALUES (dq_send.queue, dq_send.payload, v_at, v_at, v_now, v_channel, v_priority, dq_send.headers)
        RETURNING m.id, m.queue, m.due_at
    ),
    counted AS (
        INSERT INTO @extschema@.dq_counts (queue, due_bin, leased, n)
        SELECT s.queue, @extschema@.dq__due_bin(s.due_at), FALSE, 1
        FROM sent AS s
        WHERE v_counting
    )
    SELECT s.id INTO v_id FROM sent AS s;
    v_counting := @extschema@.dq__counted_inline(v_counting);
    IF v_channel = '' AND v_priority = 0 THEN
        PERFORM @extschema@.dq__wake_if_head(dq_send.queue, v_at);
    ELSE
        PERFORM @extschema@.dq__offers_written(
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
    v_now timestamptz := @extschema@.dq_now();
    v_counting boolean := FALSE;  -- dq__counting_inline's: false, the trigger counts
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_send_many.queue);
    PERFORM @extschema@.dq__check_send_arrays(payloads, scheduled_ats, channels, priorities, headers);
    IF cardinality(payloads) = 0 THEN
        RETURN;
    END IF;
    -- One insert, its rows in input order (a function scan feeding the
    -- insert, nothing between them that reorders): the identity gives them
    -- ascending ids, returned in that order.
    -- The messages and their counts in one statement (12_counts.sql).
    v_counting := @extschema@.dq__counting_inline();
    RETURN QUERY
    WITH sent AS (
        INSERT INTO @extschema@.dq_messages AS m (
            queue, payload, scheduled_at, due_at, created_at, channel, priority, headers
        )
        SELECT
            dq_send_many.queue, e.p, coalesce(e.s, v_now), coalesce(e.s, v_now), v_now,
            coalesce(e.c, ''), coalesce(e.pr, 0), e.h
        FROM unnest(payloads, scheduled_ats, channels, priorities, headers) AS e (p, s, c, pr, h)
        RETURNING m.id, m.queue, m.due_at
    ),
    counted AS (
        INSERT INTO @extschema@.dq_counts (queue, due_bin, leased, n)
        SELECT s.queue, @extschema@.dq__due_bin(s.due_at), FALSE, count(*)
        FROM sent AS s
        WHERE v_counting
        GROUP BY 1, 2
    )
    SELECT s.id FROM sent AS s;
    v_counting := @extschema@.dq__counted_inline(v_counting);
    IF channels IS NULL AND priorities IS NULL THEN
        PERFORM @extschema@.dq__wake_if_head(dq_send_many.queue, CASE
            WHEN scheduled_ats IS NULL THEN v_now
            ELSE (SELECT min(coalesce(s.s, v_now)) FROM unnest(scheduled_ats) AS s (s))
        END);
    ELSE
        PERFORM @extschema@.dq__offers_written(
            dq_send_many.queue, channels, priorities,
            ARRAY(SELECT coalesce(e.s, v_now) FROM unnest(payloads, scheduled_ats) AS e (p, s)),
            NULL::boolean[], v_now
        );
    END IF;
END
$$;
