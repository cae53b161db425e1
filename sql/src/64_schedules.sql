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
-- occurrences); its next occurrence after now. A changed expression, zone or
-- payload replaces the old configuration's pending (not leased) occurrences;
-- setting the same one again keeps its place (an occurrence already due is
-- still delivered by the next poll) and ends a failing schedule's back-off.
-- max_missed: how many of the most recent occurrences one poll delivers when
-- several came due while nobody polled (1: the latest only, never a flood).
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
    PERFORM @extschema@.dq__check_key_prefix(name, 'name');
    PERFORM @extschema@.dq__null_check(payload IS NULL, 'payload');
    PERFORM @extschema@.dq__check_between(max_missed, 'max_missed', 1, 100);
    v_next := @extschema@.dq_cron_next(expression, v_now, timezone);  -- checks both
    IF v_next IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgdq: %L names no time in the next 5 years (before year 10000 UTC)', expression);
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
            -- the same configuration keeps its place (a failing one's is
            -- missed_from: it is tried again at the next poll); an ended
            -- one starts again
            next_at = CASE
                WHEN s.config_hash = excluded.config_hash THEN coalesce(s.missed_from, s.next_at, excluded.next_at)
                ELSE excluded.next_at
            END,
            missed_from = NULL,
            failures = 0,
            last_error = NULL,
            last_error_at = NULL;
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
    PERFORM @extschema@.dq__check_key_prefix(name, 'name');
    DELETE FROM @extschema@.dq_schedules AS s
    WHERE s.queue = dq_schedule_remove.queue AND s.name = dq_schedule_remove.name;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    PERFORM @extschema@.dq__cron_delete(dq_schedule_remove.queue, dq_schedule_remove.name, NULL, FALSE);
    RETURN TRUE;
END
$$;

-- The schedules (of queue, when given) with their next occurrence (while
-- failing: the next attempt) and their last error. Does not read the clock.
CREATE FUNCTION dq_schedules(queue text DEFAULT NULL) RETURNS TABLE (
    queue text,
    name text,
    expression text,
    timezone text,
    payload jsonb,
    max_missed integer,
    next_at timestamptz,
    last_error text,
    last_error_at timestamptz,
    failures integer
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- the check is a statement of its own: it runs, row or no row
    SELECT @extschema@.dq__check_queue(dq_schedules.queue) WHERE dq_schedules.queue IS NOT NULL;
    SELECT s.queue::text, s.name::text, s.expression, s.timezone, s.payload, s.max_missed, s.next_at,
        s.last_error, s.last_error_at, s.failures
    FROM @extschema@.dq_schedules AS s
    WHERE dq_schedules.queue IS NULL OR s.queue = dq_schedules.queue
    ORDER BY s.queue, s.name;
$$;

-- The occurrences of a schedule from next_at to until, oldest first: the
-- `keep` most recent. Bounded work however long nobody polled: the
-- expression is parsed once, and it looks back from until through doubling
-- windows (then halves the last one when a burst of occurrences made it hold
-- more than 2 * keep + 10), each look giving up after that many, and all of
-- them together after 2,000 occurrences (only bursts of thousands get there;
-- it then returns the most recent it has, fewer than keep).
CREATE FUNCTION dq__due_occurrences(
    expression text, timezone text, next_at timestamptz, until timestamptz, keep integer
) RETURNS timestamptz[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_cron record;
    v_limit integer := 2 * keep + 10;  -- a look gives up beyond this many
    v_budget integer := 2000;          -- occurrences still to be computed
    v_window interval := interval '1 second';
    v_good timestamptz := until;       -- from here: fewer than keep...
    v_best timestamptz[] := '{}';      -- ...namely these
    v_bad timestamptz;                 -- from here: more than v_limit
    v_from timestamptz;
    v_at timestamptz;
    v_due timestamptz[];
    v_count integer;
    v_complete boolean;
BEGIN
    v_cron := @extschema@.dq__cron_parse(expression);
    LOOP
        v_from := CASE
            WHEN v_bad IS NOT NULL THEN v_bad + (v_good - v_bad) / 2
            WHEN until - next_at <= v_window THEN next_at
            ELSE until - v_window
        END;
        -- the occurrences from v_from to until: their count and the last keep
        v_due := '{}';
        v_count := 0;
        v_complete := FALSE;
        v_at := v_from - interval '1 microsecond';
        WHILE v_count <= v_limit AND v_budget > 0 LOOP
            v_at := @extschema@.dq__cron_next_at(
                v_at, timezone, v_cron.seconds, v_cron.minutes, v_cron.hours,
                v_cron.days, v_cron.months, v_cron.weekdays, v_cron.either_day
            );
            v_budget := v_budget - 1;
            v_complete := v_at IS NULL OR v_at > until;
            EXIT WHEN v_complete;
            v_due := (v_due || v_at)[greatest(1, cardinality(v_due) + 2 - keep):];
            v_count := v_count + 1;
        END LOOP;
        IF v_complete THEN
            IF v_count >= keep OR v_from <= next_at THEN
                RETURN v_due;
            END IF;
            v_good := v_from;
            v_best := v_due;
            v_window := v_window * 2;
        ELSIF v_count <= v_limit THEN
            RETURN v_best;  -- out of budget
        ELSE
            v_bad := v_from;
        END IF;
    END LOOP;
END
$$;

-- Turn queue's due schedule occurrences into messages and move each
-- schedule's next_at past now. Each schedule is done in a subtransaction:
-- when it fails (any error, or a statement timeout that fires meanwhile) its
-- error goes into last_error, it is tried again 1 minute later, then after
-- 2, 4 ... at most 60 (next_at; missed_from keeps the first occurrence still
-- to deliver), and the poll goes on. Bounded: no schedule is started after
-- 50 ms (the rest wait for the next poll), nor after a statement timeout.
-- Schedules another poll is materialising are skipped (it does them), and
-- occurrence keys make a repeat harmless.
CREATE FUNCTION dq__materialise(queue text, now_at timestamptz) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_started timestamptz := clock_timestamp();
    v_schedule record;
    v_due timestamptz[];
    v_next timestamptz;
    v_state text;
    v_message text;
    v_timed_out boolean := FALSE;
BEGIN
    FOR v_schedule IN
        SELECT s.* FROM @extschema@.dq_schedules AS s
        WHERE s.queue = dq__materialise.queue AND s.next_at <= dq__materialise.now_at
        ORDER BY s.name
        FOR UPDATE SKIP LOCKED
    LOOP
        EXIT WHEN clock_timestamp() - v_started > interval '50 milliseconds';
        v_state := NULL;
        BEGIN
            -- first, as it names an `after` out of range; NULL (none in the
            -- next 5 years, or none before year 10000) ends the schedule
            v_next := @extschema@.dq_cron_next(v_schedule.expression, dq__materialise.now_at, v_schedule.timezone);
            v_due := @extschema@.dq__due_occurrences(
                v_schedule.expression, v_schedule.timezone, coalesce(v_schedule.missed_from, v_schedule.next_at),
                dq__materialise.now_at, v_schedule.max_missed
            );
            INSERT INTO @extschema@.dq_messages (queue, key, payload, scheduled_at, due_at, created_at)
            SELECT dq__materialise.queue, @extschema@.dq__occurrence_key(v_schedule.name, v_schedule.config_hash, d.at),
                v_schedule.payload, d.at, d.at, dq__materialise.now_at
            FROM unnest(v_due) AS d (at)
            ORDER BY 2
            ON CONFLICT (queue, key) WHERE key IS NOT NULL DO NOTHING;
            UPDATE @extschema@.dq_schedules AS s
            SET next_at = v_next,
                missed_from = NULL,
                failures = 0,
                last_error = NULL,
                last_error_at = NULL
            WHERE s.queue = dq__materialise.queue AND s.name = v_schedule.name;
        EXCEPTION
            WHEN query_canceled THEN
                -- a statement timeout is this schedule's error; a cancel
                -- request cancels the poll. The timeout's clock starts with
                -- the statement's first protocol message (Parse, or Bind),
                -- statement_timestamp() at its Execute, milliseconds later
                -- (6 ms seen with psycopg): measured from the latest time
                -- known to precede the first message (the transaction's
                -- start; at most 1 s before Execute), or a timeout that
                -- fired on time would be taken for a cancel
                IF current_setting('statement_timeout')::interval = interval '0'
                    OR clock_timestamp() - greatest(transaction_timestamp(), statement_timestamp() - interval '1 second')
                    < current_setting('statement_timeout')::interval THEN
                    RAISE;
                END IF;
                GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
                v_timed_out := TRUE;
            WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
        END;
        IF v_state IS NOT NULL THEN
            UPDATE @extschema@.dq_schedules AS s
            SET missed_from = coalesce(s.missed_from, s.next_at),
                -- a retry past year 9999 is none: the schedule ends (NULL)
                next_at = nullif(
                    least(
                        dq__materialise.now_at + least(
                            interval '1 hour', interval '1 minute' * power(2, least(s.failures, 6))
                        ),
                        @extschema@.dq__time_end()
                    ),
                    @extschema@.dq__time_end()
                ),
                failures = s.failures + 1,
                last_error = format('%s (SQLSTATE %s)', left(v_message, 1000), v_state),
                last_error_at = dq__materialise.now_at
            WHERE s.queue = dq__materialise.queue AND s.name = v_schedule.name;
        END IF;
        EXIT WHEN v_timed_out;
    END LOOP;
END
$$;
