from django.db import models


class Stock(models.Model):
    item = models.TextField(primary_key=True)
    available = models.IntegerField()

    class Meta:
        db_table = "stock"
        # an order that takes more than is available fails here, after its task was enqueued
        constraints = [models.CheckConstraint(condition=models.Q(available__gte=0), name="stock_available_check")]


class Order(models.Model):
    item = models.ForeignKey(Stock, on_delete=models.PROTECT, db_column="item")
    quantity = models.PositiveIntegerField()
    receipt_sent_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "orders"
