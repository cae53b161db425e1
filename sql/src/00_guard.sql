-- pgdq: a delayed-message queue inside PostgreSQL.
-- The files of sql/src are concatenated in name order into one install script.
-- @extschema@ stands for the schema pgdq lives in: CREATE EXTENSION fills it in,
-- and so do `make sql` and `pgdq install` for a plain install.

-- Refuse a second install into the same schema before anything is created, so
-- that a repeated install is one clear error and never a half-installed state.
DO $guard$
BEGIN
    -- The installer puts the target schema first on search_path.
    IF EXISTS (
        SELECT 1
        FROM pg_catalog.pg_class AS c
        INNER JOIN pg_catalog.pg_namespace AS n ON c.relnamespace OPERATOR(pg_catalog.=) n.oid
        WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()
            AND c.relname OPERATOR(pg_catalog.=) 'dq_messages'
    ) THEN
        RAISE EXCEPTION USING
            ERRCODE = '42710',
            MESSAGE = pg_catalog.format('pgdq is already installed in schema %I', pg_catalog.current_schema()),
            HINT = 'Drop it first (pgdq uninstall, or DROP EXTENSION pgdq) or install into another schema.';
    END IF;
END
$guard$;
