-- What a user would build by hand for channels, after LonnyMQ's design, in
-- plain SQL (bench W8 measures it beside pgdq): a channel row with
-- max_concurrency, a current_concurrency counter, a release interval and
-- next_dequeue_at; a dequeue takes the channel with the smallest
-- next_dequeue_at under its limit (FOR UPDATE SKIP LOCKED), then its head
-- message, and moves next_dequeue_at on; an ack decrements the counter. A
-- consumer that dies leaks its slot for good (the counter never comes back);
-- ordering by next_dequeue_at serves the channel with the oldest due message,
-- not the channels in turns.

CREATE TABLE lonny_channels (
    name text PRIMARY KEY,
    max_concurrency integer,
    release_interval interval,
    current_concurrency integer NOT NULL DEFAULT 0,
    next_dequeue_at timestamptz NOT NULL DEFAULT '-infinity'
);
CREATE INDEX lonny_channels_next ON lonny_channels (next_dequeue_at);

CREATE TABLE lonny_messages (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    channel text NOT NULL,
    payload jsonb NOT NULL,
    due_at timestamptz NOT NULL,
    leased_until timestamptz
);
CREATE INDEX lonny_messages_head ON lonny_messages (channel, due_at, id) WHERE leased_until IS NULL;

-- Enqueue a batch into channels[i]; new channels have no limits.
CREATE FUNCTION lonny_enqueue(channels text[], payloads jsonb[]) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO lonny_channels (name)
    SELECT DISTINCT c FROM unnest(channels) AS c ORDER BY 1
    ON CONFLICT DO NOTHING;
    INSERT INTO lonny_messages (channel, payload, due_at)
    SELECT c, p, now() FROM unnest(channels, payloads) AS e (c, p);
    UPDATE lonny_channels AS l SET next_dequeue_at = least(l.next_dequeue_at, now())
    WHERE l.name IN (SELECT DISTINCT c FROM unnest(channels) AS c) AND l.next_dequeue_at > now();
$$;

-- Lease one message: its id, or NULL when no channel may give one.
CREATE FUNCTION lonny_dequeue(lease interval) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_channel lonny_channels;
    v_id bigint;
BEGIN
    LOOP
        SELECT * INTO v_channel FROM lonny_channels AS l
        WHERE l.next_dequeue_at <= now()
            AND (l.max_concurrency IS NULL OR l.current_concurrency < l.max_concurrency)
        ORDER BY l.next_dequeue_at
        LIMIT 1
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        SELECT m.id INTO v_id FROM lonny_messages AS m
        WHERE m.channel = v_channel.name AND m.leased_until IS NULL AND m.due_at <= now()
        ORDER BY m.due_at, m.id
        LIMIT 1
        FOR UPDATE SKIP LOCKED;
        IF v_id IS NOT NULL THEN
            UPDATE lonny_messages SET leased_until = now() + lease WHERE id = v_id;
            UPDATE lonny_channels AS l
            SET current_concurrency = l.current_concurrency + 1,
                next_dequeue_at = greatest(
                    coalesce((
                        SELECT m.due_at FROM lonny_messages AS m
                        WHERE m.channel = v_channel.name AND m.leased_until IS NULL
                        ORDER BY m.due_at, m.id LIMIT 1
                    ), 'infinity'),
                    now() + coalesce(l.release_interval, '0')
                )
            WHERE l.name = v_channel.name;
            RETURN v_id;
        END IF;
        -- nothing due in it: park it until its next message
        UPDATE lonny_channels AS l
        SET next_dequeue_at = coalesce((
            SELECT m.due_at FROM lonny_messages AS m
            WHERE m.channel = v_channel.name AND m.leased_until IS NULL
            ORDER BY m.due_at, m.id LIMIT 1
        ), 'infinity')
        WHERE l.name = v_channel.name;
    END LOOP;
END
$$;

-- Ack: delete the message and give its channel's slot back.
CREATE FUNCTION lonny_ack(id bigint) RETURNS void
LANGUAGE sql AS $$
    WITH gone AS (DELETE FROM lonny_messages AS m WHERE m.id = lonny_ack.id RETURNING m.channel)
    UPDATE lonny_channels AS l
    SET current_concurrency = l.current_concurrency - 1,
        next_dequeue_at = least(l.next_dequeue_at, now())
    FROM gone WHERE l.name = gone.channel;
$$;
