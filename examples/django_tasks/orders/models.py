"""The shop's two tables, made by ../shop.sql as for the other recipes (unmanaged here: Django
reads and writes them, and makes no migration of its own)."""

from django.db import models


class Stock(models.Model):
    item = models.TextField(primary_key=True)
    available = models.IntegerField()  # CHECK (available >= 0) in shop.sql

    class Meta:
        managed = False
        db_table = "stock"


class Order(models.Model):
    item = models.ForeignKey(Stock, on_delete=models.PROTECT, db_column="item")
    quantity = models.IntegerField()
    receipt_sent_at = models.DateTimeField(null=True)

    class Meta:
        managed = False
        db_table = "orders"
