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
    v_now timestamptz := @extschema@.dq_now();
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_channel_set.queue);
    PERFORM @extschema@.dq__null_check(dq_channel_set.channel IS NULL, 'channel');
    PERFORM @extschema@.dq__check_channel(dq_channel_set.channel, 'channel');
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
    INSERT INTO @extschema@.dq_groups AS g (queue, channel, max_concurrency, min_interval, first_due)
    VALUES
        (dq_channel_set.queue, '', NULL, NULL, v_now),
        (
            dq_channel_set.queue, dq_channel_set.channel, dq_channel_set.max_concurrency,
            nullif(dq_channel_set.min_interval, '0'), @extschema@.dq__never()
        )
    ON CONFLICT ON CONSTRAINT dq_groups_pkey DO UPDATE
        SET max_concurrency = excluded.max_concurrency,
            min_interval = excluded.min_interval,
            wake_at = NULL  -- looser limits may let a message go now
        WHERE g.channel <> '';
    PERFORM @extschema@.dq__wake(dq_channel_set.queue);
END
$$;

-- Drop the limits of one channel of queue (its messages stay); true if it had any.
CREATE FUNCTION dq_channel_remove(queue text, channel text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_channel_remove.queue);
    PERFORM @extschema@.dq__null_check(dq_channel_remove.channel IS NULL, 'channel');
    PERFORM @extschema@.dq__check_channel(dq_channel_remove.channel, 'channel');
    -- the row stays while the channel has messages (polls forget it after)
    UPDATE @extschema@.dq_groups AS g
    SET max_concurrency = NULL, min_interval = NULL, wake_at = NULL
    WHERE g.queue = dq_channel_remove.queue AND g.channel = dq_channel_remove.channel
        AND (g.max_concurrency IS NOT NULL OR g.min_interval IS NOT NULL);
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    PERFORM @extschema@.dq__wake(dq_channel_remove.queue);
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
    SELECT @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    SELECT @extschema@.dq__check_queue(dq_channels.queue);
    WITH counted AS (
        SELECT
            m.channel,
            count(*) FILTER (WHERE m.due_at <= n.now_at) AS ready,
            count(*) FILTER (WHERE m.due_at > n.now_at AND m.lock_token IS NULL) AS delayed,
            count(*) FILTER (
                WHERE @extschema@.dq__is_leased(m.lock_token, m.due_at, n.now_at)
            ) AS leased
        FROM @extschema@.dq_messages AS m
        CROSS JOIN @extschema@.dq_now() AS n (now_at)
        WHERE m.queue = dq_channels.queue AND m.channel <> ''
        GROUP BY m.channel
    ),

    limited AS (
        SELECT g.channel, g.max_concurrency, g.min_interval, g.last_leased_at
        FROM @extschema@.dq_groups AS g
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
