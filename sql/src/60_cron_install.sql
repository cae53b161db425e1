-- Recurring messages: occurrences are ordinary messages whose keys are
-- {key_prefix}/{config_hash}/{YYYYMMDD}T{HHMMSS}.{microseconds}Z.

-- Raise 22004/22023 unless part is 1..max_length characters without '/'.
CREATE FUNCTION dq__check_key_part(
    part text, arg_name text, max_length integer
) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.dq__check_name(part, arg_name, max_length);
    IF strpos(part, '/') > 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('pgdq: %s must not contain "/"', arg_name);
    END IF;
END
$$;

-- The occurrence key of one scheduled time (the time in UTC).
CREATE FUNCTION dq__occurrence_key(
    key_prefix text, config_hash text, at timestamptz
) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT key_prefix OPERATOR(pg_catalog.||) '/'
        OPERATOR(pg_catalog.||) config_hash OPERATOR(pg_catalog.||) '/'
        OPERATOR(pg_catalog.||) pg_catalog.to_char(
            at AT TIME ZONE 'UTC', 'YYYYMMDD"T"HH24MISS.US"Z"'
        )
$$;

-- Raise 22004/22023 unless key_prefix (a cron key prefix, or a schedule's
-- name: arg_name) is 1..100 characters without '/'.
CREATE FUNCTION dq__check_key_prefix(key_prefix text, arg_name text) RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@.dq__check_key_part(key_prefix, arg_name, 100) $$;

-- Raise 22004/22023 unless config_hash is 1..64 characters without '/'.
CREATE FUNCTION dq__check_config_hash(config_hash text) RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@.dq__check_key_part(config_hash, 'config_hash', 64) $$;

-- Delete the not-leased occurrences under key_prefix/ whose keys are in
-- [from_key, below_key) (NULL: unbounded), all of them or only those whose
-- config hash is (keep_hash = false) or is not (keep_hash = true)
-- config_hash; the count deleted. Rows are locked in key order, like every
-- multi-row writer.
CREATE FUNCTION dq__cron_delete(
    queue text, key_prefix text, config_hash text, keep_hash boolean,
    from_key text DEFAULT NULL, below_key text DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_deleted integer;
BEGIN
    -- Keys are in C collation, so "starts with prefix/" is the index range
    -- [prefix/, prefix0): '0' is the byte after '/'. No LIKE pattern, so a
    -- prefix with % or _ in it means only itself.
    WITH doomed AS (
        SELECT m.id
        FROM @extschema@.dq_messages AS m
        WHERE m.queue = dq__cron_delete.queue
            AND m.key >= greatest(dq__cron_delete.key_prefix || '/', dq__cron_delete.from_key)
            AND m.key < least(dq__cron_delete.key_prefix || '0', dq__cron_delete.below_key)
            AND NOT @extschema@.dq__is_leased(m.lock_token, m.due_at, v_now)
            AND (
                dq__cron_delete.config_hash IS NULL
                OR (
                    split_part(substr(m.key, length(dq__cron_delete.key_prefix) + 2), '/', 1)
                    = dq__cron_delete.config_hash
                ) <> dq__cron_delete.keep_hash
            )
        ORDER BY m.key
        FOR UPDATE
    )

    DELETE FROM @extschema@.dq_messages AS m
    USING doomed AS d
    WHERE m.id = d.id;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$$;

-- Replace key_prefix's pending occurrences of other configurations and offer
-- the future ones given; the number of occurrences created (docs/sql-reference.md).
CREATE FUNCTION dq_cron_install(
    queue text,
    key_prefix text,
    config_hash text,
    scheduled_ats timestamptz[],
    payloads jsonb[],
    can_update boolean DEFAULT FALSE
) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_keys text[];
    v_payloads jsonb[];
    v_ats timestamptz[];
    v_created integer;
    v_range_start text;
    v_range_end text;
BEGIN
    PERFORM @extschema@.dq__check_queue(queue);
    PERFORM @extschema@.dq__check_key_prefix(key_prefix, 'key_prefix');
    PERFORM @extschema@.dq__check_config_hash(config_hash);
    PERFORM @extschema@.dq__null_check(scheduled_ats IS NULL, 'scheduled_ats');
    PERFORM @extschema@.dq__null_check(payloads IS NULL, 'payloads');
    PERFORM @extschema@.dq__null_check(can_update IS NULL, 'can_update');
    IF cardinality(scheduled_ats) <> cardinality(payloads)
        OR coalesce(array_ndims(scheduled_ats), 1) > 1
        OR coalesce(array_ndims(payloads), 1) > 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format(
                'pgdq: scheduled_ats and payloads must be one-dimensional arrays of equal length, got %s and %s',
                cardinality(scheduled_ats), cardinality(payloads)
            );
    END IF;
    PERFORM @extschema@.dq__check_elements(pg_catalog.array_position(scheduled_ats, NULL), scheduled_ats IS NULL, 'scheduled_ats');
    PERFORM @extschema@.dq__check_elements(pg_catalog.array_position(payloads, NULL), payloads IS NULL, 'payloads');
    PERFORM @extschema@.dq__check_time_elements(scheduled_ats, 'scheduled_ats');

    -- Installers of one prefix take turns, so the last one to run sees (and
    -- replaces) everything the one before it wrote.
    PERFORM pg_advisory_xact_lock(hashtextextended(queue || '/' || key_prefix, 0));
    -- Now, again: an installer that waited here for another must not install
    -- an occurrence that fell due while it waited, and that a consumer may
    -- have taken and acked already (two schedulers delivered one twice).
    v_now := @extschema@.dq_now();
    -- This configuration's keys are the range [prefix/hash/, prefix/hash0).
    -- Other configurations' occurrences below it are deleted first, this
    -- one's are offered, then those above it are deleted: one ascending key
    -- order, the order every multi-row writer locks in, so none deadlock.
    v_range_start := key_prefix || '/' || config_hash || '/';
    v_range_end := key_prefix || '/' || config_hash || '0';
    PERFORM @extschema@.dq__cron_delete(queue, key_prefix, config_hash, true, NULL, v_range_start);

    -- Occurrences at or before now are skipped: already due means already
    -- (being) processed, and must never be installed again.
    SELECT
        coalesce(array_agg(@extschema@.dq__occurrence_key(key_prefix, config_hash, o.at) ORDER BY o.ord), '{}'),
        coalesce(array_agg(o.payload ORDER BY o.ord), '{}'),
        coalesce(array_agg(o.at ORDER BY o.ord), '{}')
    INTO v_keys, v_payloads, v_ats
    FROM unnest(scheduled_ats, payloads) WITH ORDINALITY AS o (at, payload, ord)
    WHERE o.at > v_now;

    SELECT count(*) FILTER (WHERE r.outcome = 'created') INTO v_created
    FROM @extschema@.dq_offer_many(queue, v_keys, v_payloads, v_ats, can_update) AS r;
    PERFORM @extschema@.dq__cron_delete(queue, key_prefix, config_hash, true, v_range_end, NULL);
    RETURN v_created;
END
$$;

-- Delete the not-leased occurrences under key_prefix/ (only config_hash's
-- when given); the count deleted.
CREATE FUNCTION dq_cron_uninstall(
    queue text,
    key_prefix text,
    config_hash text DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.dq__check_queue(queue);
    PERFORM @extschema@.dq__check_key_prefix(key_prefix, 'key_prefix');
    IF config_hash IS NOT NULL THEN
        PERFORM @extschema@.dq__check_config_hash(config_hash);
    END IF;
    RETURN @extschema@.dq__cron_delete(queue, key_prefix, config_hash, false);
END
$$;
