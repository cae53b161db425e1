-- dq_cron_next: the next time a cron expression names, in a time zone (an
-- addition to version 1 of the SQL API). Standard 5 fields (minute hour day-of-month month
-- day-of-week) or 6 with a leading seconds field; lists, ranges, steps,
-- month and day names. It agrees with croniter, DST edges included:
--   * a matching wall time that a spring-forward gap skips fires once, at the
--     end of the gap (02:30 on the night New York jumps 02:00 -> 03:00 fires
--     at 03:00 EDT);
--   * a matching wall time that falls back happens twice, and fires twice
--     (01:30 EDT, then 01:30 EST).
-- When both day-of-month and day-of-week are restricted, a day matches either
-- of them (the usual OR rule); like croniter, a field that lists every value
-- counts as unrestricted when the other day field contains a "*".

-- One name or number of a cron field as its number (NULL when it is neither).
CREATE FUNCTION dq__cron_value(token text, field text) RETURNS integer
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE
        WHEN token OPERATOR(pg_catalog.~) '^[0-9]{1,4}$' THEN token::pg_catalog.int4
        WHEN field OPERATOR(pg_catalog.=) 'month' THEN pg_catalog.array_position(
            ARRAY['jan', 'feb', 'mar', 'apr', 'may', 'jun', 'jul', 'aug', 'sep', 'oct', 'nov', 'dec'], token
        )
        WHEN field OPERATOR(pg_catalog.=) 'day of week' THEN pg_catalog.array_position(
            ARRAY['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat'], token
        ) OPERATOR(pg_catalog.-) 1
    END
$$;

-- The sorted values one cron field allows, or 22023 naming the field.
CREATE FUNCTION dq__cron_field(spec text, field text, lo integer, hi integer) RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_part text;
    v_match text[];
    v_from integer;
    v_to integer;
    v_step integer;
    v_values integer[] := '{}';
BEGIN
    FOREACH v_part IN ARRAY string_to_array(lower(spec), ',') LOOP
        v_match := regexp_match(v_part, '^(\*|\?|([a-z0-9]+)(-([a-z0-9]+))?)(/([0-9]{1,4}))?$');
        v_step := coalesce(v_match[6]::integer, 1);
        IF v_match IS NULL OR v_step = 0 THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('pgdq: invalid %s field %L in cron expression', field, spec);
        END IF;
        -- an open range (* or a/n) of weekdays ends at 6: 7 is only an alias of Sunday
        IF v_match[1] IN ('*', '?') THEN
            v_from := lo;
            v_to := CASE WHEN field = 'day of week' THEN 6 ELSE hi END;
        ELSE
            v_from := @extschema@.dq__cron_value(v_match[2], field);
            v_to := CASE
                WHEN v_match[4] IS NOT NULL THEN @extschema@.dq__cron_value(v_match[4], field)
                WHEN v_match[6] IS NOT NULL THEN CASE WHEN field = 'day of week' THEN 6 ELSE hi END
                ELSE v_from
            END;
        END IF;
        IF v_from IS NULL OR v_to IS NULL OR v_from < lo OR v_to > hi OR v_from > v_to THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('pgdq: %s field %L is out of range %s-%s or reversed', field, spec, lo, hi);
        END IF;
        v_values := v_values || ARRAY(SELECT generate_series(v_from, v_to, v_step));
    END LOOP;
    IF field = 'day of week' THEN
        v_values := array_replace(v_values, 7, 0);  -- 7 is Sunday too
    END IF;
    RETURN ARRAY(SELECT DISTINCT v.v FROM unnest(v_values) AS v (v) ORDER BY v.v);
END
$$;

-- The UTC offset of zone at instant.
CREATE FUNCTION dq__zone_offset(instant timestamptz, zone text) RETURNS interval
LANGUAGE sql STABLE
AS $$ SELECT (instant AT TIME ZONE zone) OPERATOR(pg_catalog.-) (instant AT TIME ZONE 'UTC') $$;

-- The instants at which zone's clocks read wall: one, two in a fall-back
-- fold, or, for a time a spring-forward gap skips, the end of the gap.
CREATE FUNCTION dq__wall_instants(wall timestamp, zone text) RETURNS SETOF timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_guess timestamptz := wall AT TIME ZONE zone;
    v_before interval := @extschema@.dq__zone_offset(v_guess - interval '3 hours', zone);
    v_after interval := @extschema@.dq__zone_offset(v_guess + interval '3 hours', zone);
    v_lo timestamptz;
    v_hi timestamptz;
    v_mid timestamptz;
    v_found bigint;
BEGIN
    RETURN QUERY
    SELECT DISTINCT c.at
    FROM (VALUES ((wall - v_before) AT TIME ZONE 'UTC'), ((wall - v_after) AT TIME ZONE 'UTC')) AS c (at)
    WHERE (c.at AT TIME ZONE zone) = wall
    ORDER BY c.at;
    GET DIAGNOSTICS v_found = ROW_COUNT;
    IF v_found > 0 THEN
        RETURN;
    END IF;
    -- in a gap: bisect for the first instant on the new offset
    v_lo := v_guess - interval '3 hours';
    v_hi := v_guess + interval '3 hours';
    WHILE v_hi - v_lo > interval '1 second' LOOP
        v_mid := v_lo + (v_hi - v_lo) / 2;
        IF @extschema@.dq__zone_offset(v_mid, zone) = v_after THEN
            v_hi := v_mid;
        ELSE
            v_lo := v_mid;
        END IF;
    END LOOP;
    RETURN NEXT date_trunc('second', v_hi);
END
$$;

-- The first time after `after` that expression names in zone (NULL if none
-- within 5 years); 22023 for an invalid expression or zone. STABLE, not
-- IMMUTABLE: the answer depends on the server's time zone data.
CREATE FUNCTION dq_cron_next(expression text, after timestamptz, timezone text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_fields text[];
    v_seconds integer[];
    v_minutes integer[];
    v_hours integer[];
    v_days integer[];
    v_months integer[];
    v_weekdays integer[];
    v_either_day boolean;    -- both day fields restricted: OR
    v_near_shift boolean;    -- a DST change within 3 hours of after
    v_start timestamp;       -- the first wall time worth looking at
    v_day date;
    v_wall timestamp;
    v_at timestamptz;
    v_best timestamptz;
    v_hour integer;
    v_minute integer;
    v_second integer;
BEGIN
    PERFORM @extschema@.dq__null_check(expression IS NULL, 'expression');
    PERFORM @extschema@.dq__null_check(after IS NULL, 'after');
    PERFORM @extschema@.dq__null_check(timezone IS NULL, 'timezone');
    PERFORM @extschema@.dq__check_finite(after, 'after');
    IF length(expression) > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgdq: expression must be at most 1000 characters, got %s', length(expression));
    END IF;
    v_fields := regexp_split_to_array(btrim(expression), '\s+');
    IF cardinality(v_fields) = 5 THEN
        v_fields := '0'::text || v_fields;
    ELSIF cardinality(v_fields) <> 6 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgdq: a cron expression has 5 fields (or 6 with seconds first), got %L', expression);
    END IF;
    v_seconds := @extschema@.dq__cron_field(v_fields[1], 'second', 0, 59);
    v_minutes := @extschema@.dq__cron_field(v_fields[2], 'minute', 0, 59);
    v_hours := @extschema@.dq__cron_field(v_fields[3], 'hour', 0, 23);
    v_days := @extschema@.dq__cron_field(v_fields[4], 'day of month', 1, 31);
    v_months := @extschema@.dq__cron_field(v_fields[5], 'month', 1, 12);
    v_weekdays := @extschema@.dq__cron_field(v_fields[6], 'day of week', 0, 7);
    -- croniter's reading of "restricted": not a bare *, and not every value
    -- when the other day field has a * in it
    v_either_day := NOT (
        v_fields[4] IN ('*', '?') OR (cardinality(v_days) = 31 AND strpos(v_fields[6], '*') > 0)
    ) AND NOT (
        v_fields[6] IN ('*', '?') OR (cardinality(v_weekdays) = 7 AND strpos(v_fields[4], '*') > 0)
    );

    -- Around a DST change a later wall time can be an earlier instant, so
    -- look from 3 hours of wall time back and keep the earliest instant.
    v_near_shift := @extschema@.dq__zone_offset(after - interval '3 hours', timezone)
        <> @extschema@.dq__zone_offset(after + interval '3 hours', timezone);
    v_start := date_trunc('second', after AT TIME ZONE timezone)
        - CASE WHEN v_near_shift THEN interval '3 hours' ELSE interval '0' END;
    v_day := v_start::date;
    WHILE v_day < v_start::date + 366 * 5 LOOP
        IF NOT extract(MONTH FROM v_day)::integer = ANY(v_months) THEN
            v_day := date_trunc('month', v_day) + interval '1 month';
            CONTINUE;
        END IF;
        IF (v_either_day AND (extract(DAY FROM v_day)::integer = ANY(v_days)
                OR extract(DOW FROM v_day)::integer = ANY(v_weekdays)))
            OR (NOT v_either_day AND extract(DAY FROM v_day)::integer = ANY(v_days)
                AND extract(DOW FROM v_day)::integer = ANY(v_weekdays)) THEN
            FOREACH v_hour IN ARRAY v_hours LOOP
                CONTINUE WHEN v_day + make_interval(hours => v_hour + 1) <= v_start;
                FOREACH v_minute IN ARRAY v_minutes LOOP
                    CONTINUE WHEN v_day + make_interval(hours => v_hour, mins => v_minute + 1) <= v_start;
                    FOREACH v_second IN ARRAY v_seconds LOOP
                        v_wall := v_day + make_interval(hours => v_hour, mins => v_minute, secs => v_second);
                        CONTINUE WHEN v_wall < v_start;
                        IF v_best IS NOT NULL AND v_wall > (v_best AT TIME ZONE timezone) + interval '3 hours' THEN
                            RETURN v_best;
                        END IF;
                        FOR v_at IN SELECT w.at FROM @extschema@.dq__wall_instants(v_wall, timezone) AS w (at) LOOP
                            IF v_at > after AND (v_best IS NULL OR v_at < v_best) THEN
                                v_best := v_at;
                            END IF;
                        END LOOP;
                        -- far from any DST change the first instant found is the answer
                        IF v_best IS NOT NULL AND @extschema@.dq__zone_offset(v_best - interval '3 hours', timezone)
                            = @extschema@.dq__zone_offset(v_best + interval '3 hours', timezone) THEN
                            RETURN v_best;
                        END IF;
                    END LOOP;
                END LOOP;
            END LOOP;
        END IF;
        v_day := v_day + 1;
    END LOOP;
    RETURN v_best;
END
$$;
