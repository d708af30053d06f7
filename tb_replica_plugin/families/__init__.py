"""The stat families, one package each (see `tb_replica_plugin.registry`)."""
