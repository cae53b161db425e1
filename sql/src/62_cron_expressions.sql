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

-- One name or number of a cron field as its number: 10000 (out of every
-- range) for a number of more than 4 digits, NULL for an unknown name.
CREATE FUNCTION dq__cron_value(token text, field text) RETURNS integer
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE
        WHEN token OPERATOR(pg_catalog.~) '^[0-9]+$' THEN CASE
            WHEN pg_catalog.length(token) OPERATOR(pg_catalog.<=) 4 THEN token::pg_catalog.int4
            ELSE 10000
        END
        WHEN field OPERATOR(pg_catalog.=) 'month' THEN pg_catalog.array_position(
            ARRAY['jan', 'feb', 'mar', 'apr', 'may', 'jun', 'jul', 'aug', 'sep', 'oct', 'nov', 'dec'], token
        )
        WHEN field OPERATOR(pg_catalog.=) 'day of week' THEN pg_catalog.array_position(
            ARRAY['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat'], token
        ) OPERATOR(pg_catalog.-) 1
    END
$$;

-- The sorted values one cron field allows, or 22023 naming the field. At
-- most 60 list items (no field has more values); linear in the field's
-- length: each item is read once and the values are made in one query.
CREATE FUNCTION dq__cron_field(spec text, field text, lo integer, hi integer) RETURNS integer[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_parts text[] := string_to_array(lower(spec), ',');
    v_part text;
    v_match text[];
    v_from integer;
    v_to integer;
    v_step integer;
    v_froms integer[] := '{}';
    v_tos integer[] := '{}';
    v_steps integer[] := '{}';
BEGIN
    IF cardinality(v_parts) > 60 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgdq: %s field has %s list items, at most 60', field, cardinality(v_parts));
    END IF;
    FOREACH v_part IN ARRAY v_parts LOOP
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
            IF v_from IS NULL OR v_to IS NULL THEN
                RAISE EXCEPTION USING ERRCODE = '22023',
                    MESSAGE = format(
                        'pgdq: unknown name %L in %s field %L',
                        CASE WHEN v_from IS NULL THEN v_match[2] ELSE v_match[4] END, field, spec
                    );
            END IF;
        END IF;
        IF v_from < lo OR v_to > hi OR v_from > v_to THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('pgdq: %s field %L is out of range %s-%s or reversed', field, spec, lo, hi);
        END IF;
        -- the usual field, one value or one range: a slice of 0..59
        IF cardinality(v_parts) = 1 AND v_step = 1 AND NOT (field = 'day of week' AND v_to = 7) THEN
            RETURN ('[0:59]={0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,'
                '30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59}'::integer[])[v_from:v_to];
        END IF;
        v_froms := v_froms || v_from;
        v_tos := v_tos || v_to;
        v_steps := v_steps || v_step;
    END LOOP;
    RETURN ARRAY(
        SELECT DISTINCT CASE WHEN field = 'day of week' AND g.v = 7 THEN 0 ELSE g.v END  -- 7 is Sunday too
        FROM unnest(v_froms, v_tos, v_steps) AS r (f, t, s)
        CROSS JOIN LATERAL generate_series(r.f, r.t, r.s) AS g (v)
        ORDER BY 1
    );
END
$$;

-- expression's fields as sorted values (seconds 0 when it has 5 fields);
-- either_day: both day fields are restricted, so a day matching either
-- counts. 22023 for an expression over 1,000 characters or a bad field.
CREATE FUNCTION dq__cron_parse(
    expression text,
    OUT seconds integer[],
    OUT minutes integer[],
    OUT hours integer[],
    OUT days integer[],
    OUT months integer[],
    OUT weekdays integer[],
    OUT either_day boolean
)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_fields text[];
BEGIN
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
    seconds := @extschema@.dq__cron_field(v_fields[1], 'second', 0, 59);
    minutes := @extschema@.dq__cron_field(v_fields[2], 'minute', 0, 59);
    hours := @extschema@.dq__cron_field(v_fields[3], 'hour', 0, 23);
    days := @extschema@.dq__cron_field(v_fields[4], 'day of month', 1, 31);
    months := @extschema@.dq__cron_field(v_fields[5], 'month', 1, 12);
    weekdays := @extschema@.dq__cron_field(v_fields[6], 'day of week', 0, 7);
    -- croniter's reading of "restricted": not a bare *, and not every value
    -- when the other day field has a * in it
    either_day := NOT (
        v_fields[4] IN ('*', '?') OR (cardinality(days) = 31 AND strpos(v_fields[6], '*') > 0)
    ) AND NOT (
        v_fields[6] IN ('*', '?') OR (cardinality(weekdays) = 7 AND strpos(v_fields[4], '*') > 0)
    );
END
$$;

-- The UTC offset of zone at instant.
CREATE FUNCTION dq__zone_offset(instant timestamptz, zone text) RETURNS interval
LANGUAGE sql STABLE
AS $$ SELECT (instant AT TIME ZONE zone) OPERATOR(pg_catalog.-) (instant AT TIME ZONE 'UTC') $$;

-- The first whole second after lo at which zone's UTC offset is the one it
-- has at hi: the instant its clocks change, when they change once between.
CREATE FUNCTION dq__zone_shift(lo timestamptz, hi timestamptz, zone text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_target interval := @extschema@.dq__zone_offset(hi, zone);
    v_lo timestamptz := date_trunc('second', lo);
    v_hi timestamptz := date_trunc('second', hi);
    v_mid timestamptz;
BEGIN
    WHILE v_hi - v_lo > interval '1 second' LOOP
        v_mid := v_lo + date_trunc('second', (v_hi - v_lo) / 2);
        IF @extschema@.dq__zone_offset(v_mid, zone) = v_target THEN
            v_hi := v_mid;
        ELSE
            v_lo := v_mid;
        END IF;
    END LOOP;
    RETURN v_hi;
END
$$;

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
    v_found bigint;
BEGIN
    RETURN QUERY
    SELECT DISTINCT c.at
    FROM (VALUES ((wall - v_before) AT TIME ZONE 'UTC'), ((wall - v_after) AT TIME ZONE 'UTC')) AS c (at)
    WHERE (c.at AT TIME ZONE zone) = wall
    ORDER BY c.at;
    GET DIAGNOSTICS v_found = ROW_COUNT;
    IF v_found = 0 THEN
        -- in a gap: the first instant on the new offset
        RETURN NEXT @extschema@.dq__zone_shift(v_guess - interval '3 hours', v_guess + interval '3 hours', zone);
    END IF;
END
$$;

-- The first wall-clock time at or after start that the parsed fields name
-- (see dq__cron_parse); NULL if none before the fifth year from start's day.
CREATE FUNCTION dq__cron_next_wall(
    start timestamp,
    seconds integer[],
    minutes integer[],
    hours integer[],
    days integer[],
    months integer[],
    weekdays integer[],
    either_day boolean
) RETURNS timestamp
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_day date := start::date;
    v_end date := start::date + 366 * 5;
    v_wall timestamp;
    v_hour integer;
    v_minute integer;
    v_second integer;
BEGIN
    WHILE v_day < v_end LOOP
        IF NOT extract(MONTH FROM v_day)::integer = ANY(months) THEN
            v_day := date_trunc('month', v_day) + interval '1 month';
            CONTINUE;
        END IF;
        IF (either_day AND (extract(DAY FROM v_day)::integer = ANY(days)
                OR extract(DOW FROM v_day)::integer = ANY(weekdays)))
            OR (NOT either_day AND extract(DAY FROM v_day)::integer = ANY(days)
                AND extract(DOW FROM v_day)::integer = ANY(weekdays)) THEN
            FOREACH v_hour IN ARRAY hours LOOP
                CONTINUE WHEN v_day + make_interval(hours => v_hour + 1) <= start;
                FOREACH v_minute IN ARRAY minutes LOOP
                    CONTINUE WHEN v_day + make_interval(hours => v_hour, mins => v_minute + 1) <= start;
                    FOREACH v_second IN ARRAY seconds LOOP
                        v_wall := v_day + make_interval(hours => v_hour, mins => v_minute, secs => v_second);
                        IF v_wall >= start THEN
                            RETURN v_wall;
                        END IF;
                    END LOOP;
                END LOOP;
            END LOOP;
        END IF;
        v_day := v_day + 1;
    END LOOP;
    RETURN NULL;
END
$$;

-- The first time after `after` that the parsed fields name in zone (NULL
-- if none within 5 years), with dq_cron_next's DST rules. A few offset
-- probes and calendar steps, near a DST change too: with the clocks
-- reading w(t) at instant t, the wall times after `after` are walked in
-- order and the first that names a time is mapped to its instants, which
-- is right unless the clocks fall back soon (within 3 hours; changes are
-- assumed at least 6 hours apart): then the rest of the first pass comes
-- first, and then the times from the fold on.
CREATE FUNCTION dq__cron_next_at(
    after timestamptz,
    zone text,
    seconds integer[],
    minutes integer[],
    hours integer[],
    days integer[],
    months integer[],
    weekdays integer[],
    either_day boolean
) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_offset interval := @extschema@.dq__zone_offset(after, zone);
    v_later interval := @extschema@.dq__zone_offset(after + interval '3 hours', zone);
    v_from timestamp := date_trunc('second', after AT TIME ZONE zone) + interval '1 second';
    v_floor timestamptz := after;  -- the answer is later than this
    v_fold timestamptz;
    v_wall timestamp;
    v_at timestamptz;
BEGIN
    IF v_later < v_offset THEN
        -- the clocks fall back within 3 hours, at v_fold: first the rest of
        -- the first pass, then from the fold on, where they repeat times
        v_fold := @extschema@.dq__zone_shift(after, after + interval '3 hours', zone);
        v_wall := @extschema@.dq__cron_next_wall(v_from, seconds, minutes, hours, days, months, weekdays, either_day);
        IF v_wall < (v_fold AT TIME ZONE 'UTC') + v_offset THEN
            RETURN (v_wall - v_offset) AT TIME ZONE 'UTC';
        END IF;
        v_from := v_fold AT TIME ZONE zone;
        v_floor := v_fold - interval '1 microsecond';
    END IF;
    FOR i IN 1..10 LOOP
        v_wall := @extschema@.dq__cron_next_wall(v_from, seconds, minutes, hours, days, months, weekdays, either_day);
        IF v_wall IS NULL THEN
            RETURN NULL;
        END IF;
        v_at := (v_wall - v_offset) AT TIME ZONE 'UTC';
        -- no change of the clocks within 3 hours, and the time is within them
        IF v_later = v_offset AND v_at <= after + interval '3 hours' THEN
            RETURN v_at;
        END IF;
        SELECT min(w.at) INTO v_at FROM @extschema@.dq__wall_instants(v_wall, zone) AS w (at) WHERE w.at > v_floor;
        IF v_at IS NOT NULL THEN
            RETURN v_at;
        END IF;
        v_from := v_wall + interval '1 second';
    END LOOP;
    RETURN NULL;
END
$$;

-- The first time after `after` that expression names in zone (NULL if none
-- within 5 years, or none before year 10000); 22023 for an invalid
-- expression or zone, or an `after` outside years 1 to 9999 UTC (the
-- readable range, dq__valid_time). STABLE, not IMMUTABLE: the answer
-- depends on the server's time zone data.
CREATE FUNCTION dq_cron_next(expression text, after timestamptz, timezone text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_cron record;
    v_at timestamptz;
BEGIN
    PERFORM @extschema@.dq__null_check(expression IS NULL, 'expression');
    PERFORM @extschema@.dq__null_check(after IS NULL, 'after');
    PERFORM @extschema@.dq__null_check(timezone IS NULL, 'timezone');
    PERFORM @extschema@.dq__check_time(after, 'after');
    v_cron := @extschema@.dq__cron_parse(expression);
    v_at := @extschema@.dq__cron_next_at(
        after, timezone, v_cron.seconds, v_cron.minutes, v_cron.hours,
        v_cron.days, v_cron.months, v_cron.weekdays, v_cron.either_day
    );
    -- an occurrence past the readable range is none
    RETURN CASE WHEN v_at < @extschema@.dq__time_end() THEN v_at END;
END
$$;
