DROP TABLE IF EXISTS inbox_maintenance_lease;
