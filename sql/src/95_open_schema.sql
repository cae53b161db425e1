-- Install and upgrade warn when every role may create objects in pgdq's schema.

-- Raise a WARNING when PUBLIC may create objects in schema. pgdq's functions
-- never call what others create there (docs/security.md), but the roles that
-- use pgdq search that schema too: anyone could plant functions they call.
CREATE FUNCTION dq__warn_if_open_schema(schema text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF has_schema_privilege('public', schema, 'CREATE') THEN
        RAISE WARNING USING
            MESSAGE = format('pgdq: every role may create objects in schema %I', schema),
            DETAIL = 'pgdq''s functions never call objects created there, but the roles that use '
            'pgdq search that schema too: anyone may plant functions they call by mistake.',
            HINT = format(
                'REVOKE CREATE ON SCHEMA %I FROM PUBLIC, or install pgdq into a schema of its own.', schema
            );
    END IF;
END
$$;

SELECT @extschema@.dq__warn_if_open_schema(pg_catalog.current_schema());
