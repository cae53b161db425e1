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
-- occurrences); its next occurrence. A changed expression, zone or payload
-- replaces the old configuration's pending (not leased) occurrences; setting
-- the same one again changes nothing. max_missed: how many of the most
-- recent occurrences one poll delivers when several came due while nobody
-- polled (1: the latest only, never a flood).
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
    v_now timestamptz := @extschema@.dq_now();
    v_hash text;
    v_next timestamptz;
BEGIN
    PERFORM @extschema@.dq__check_queue(queue);
    PERFORM @extschema@.dq__check_key_part(name, 'name', 100);
    PERFORM @extschema@.dq__null_check(payload IS NULL, 'payload');
    PERFORM @extschema@.dq__null_check(max_missed IS NULL, 'max_missed');
    IF max_missed NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgdq: max_missed must be 1 to 100, got %s', max_missed);
    END IF;
    v_next := @extschema@.dq_cron_next(expression, v_now, timezone);  -- checks both
    IF v_next IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgdq: %L names no time in the next 5 years', expression);
    END IF;
    v_hash := @extschema@.dq__schedule_hash(expression, timezone, payload);

    INSERT INTO @extschema@.dq_schedules AS s (queue, name, expression, timezone, payload, config_hash, max_missed, next_at)
    VALUES (dq_schedule_set.queue, dq_schedule_set.name, expression, timezone, payload, v_hash, max_missed, v_next)
    ON CONFLICT ON CONSTRAINT dq_schedules_pkey DO UPDATE
        SET expression = excluded.expression,
            timezone = excluded.timezone,
            payload = excluded.payload,
            config_hash = excluded.config_hash,
            max_missed = excluded.max_missed,
            -- the same configuration keeps its place
            next_at = CASE WHEN s.config_hash = excluded.config_hash THEN s.next_at ELSE excluded.next_at END
    RETURNING s.next_at INTO v_next;
    PERFORM @extschema@.dq__cron_delete(dq_schedule_set.queue, dq_schedule_set.name, v_hash, TRUE);
    PERFORM @extschema@.dq__wake(dq_schedule_set.queue);  -- idle workers re-read dq_next_due
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
    v_clock timestamptz := @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM @extschema@.dq__check_queue(queue);
    PERFORM @extschema@.dq__check_key_part(name, 'name', 100);
    DELETE FROM @extschema@.dq_schedules AS s
    WHERE s.queue = dq_schedule_remove.queue AND s.name = dq_schedule_remove.name;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    PERFORM @extschema@.dq__cron_delete(dq_schedule_remove.queue, dq_schedule_remove.name, NULL, FALSE);
    RETURN TRUE;
END
$$;

-- The schedules (of queue, when given) with their next occurrence.
CREATE FUNCTION dq_schedules(queue text DEFAULT NULL) RETURNS TABLE (
    queue text,
    name text,
    expression text,
    timezone text,
    payload jsonb,
    max_missed integer,
    next_at timestamptz
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.queue::text, s.name::text, s.expression, s.timezone, s.payload, s.max_missed, s.next_at
    FROM @extschema@.dq_schedules AS s
    WHERE $1 IS NULL OR s.queue = $1
    ORDER BY s.queue, s.name
$$;

-- The occurrences of a schedule due by `until`, oldest first, at most
-- `keep` of the most recent: bounded work however long nobody polled (it
-- looks back through doubling windows instead of walking from next_at).
CREATE FUNCTION dq__due_occurrences(
    expression text, timezone text, next_at timestamptz, until timestamptz, keep integer
) RETURNS timestamptz[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_window interval := interval '1 second';
    v_at timestamptz;
    v_due timestamptz[];
BEGIN
    LOOP
        v_at := CASE
            WHEN until - v_window <= next_at THEN next_at
            ELSE @extschema@.dq_cron_next(expression, until - v_window, timezone)
        END;
        v_due := '{}';
        FOR i IN 1..2000 LOOP
            EXIT WHEN v_at IS NULL OR v_at > until;
            v_due := (v_due || v_at)[greatest(1, cardinality(v_due) + 2 - keep):];
            v_at := @extschema@.dq_cron_next(expression, v_at, timezone);
        END LOOP;
        EXIT WHEN cardinality(v_due) >= keep OR until - v_window <= next_at OR v_window > interval '400 days';
        v_window := v_window * 2;
    END LOOP;
    RETURN v_due;
END
$$;

-- Turn queue's due schedule occurrences into messages and move each
-- schedule's next_at past now. Schedules another poll is materialising are
-- skipped (it does them), and occurrence keys make a repeat harmless.
CREATE FUNCTION dq__materialise(p_queue text, p_now timestamptz) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_schedule record;
    v_due timestamptz[];
BEGIN
    FOR v_schedule IN
        SELECT s.* FROM @extschema@.dq_schedules AS s
        WHERE s.queue = p_queue AND s.next_at <= p_now
        ORDER BY s.name
        FOR UPDATE SKIP LOCKED
    LOOP
        v_due := @extschema@.dq__due_occurrences(
            v_schedule.expression, v_schedule.timezone, v_schedule.next_at, p_now, v_schedule.max_missed
        );
        INSERT INTO @extschema@.dq_messages (queue, key, payload, scheduled_at, due_at, created_at)
        SELECT p_queue, @extschema@.dq__occurrence_key(v_schedule.name, v_schedule.config_hash, d.at),
            v_schedule.payload, d.at, d.at, p_now
        FROM unnest(v_due) AS d (at)
        ORDER BY 2
        ON CONFLICT ON CONSTRAINT dq_messages_queue_key DO NOTHING;
        UPDATE @extschema@.dq_schedules AS s
        SET next_at = coalesce(
            @extschema@.dq_cron_next(v_schedule.expression, greatest(p_now, v_schedule.next_at), v_schedule.timezone),
            'infinity'
        )
        WHERE s.queue = p_queue AND s.name = v_schedule.name;
    END LOOP;
END
$$;
