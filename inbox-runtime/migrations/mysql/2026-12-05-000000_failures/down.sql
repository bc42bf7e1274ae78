DROP TABLE IF EXISTS inbox_failures;
