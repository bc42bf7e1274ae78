DROP TABLE app_ledger;
